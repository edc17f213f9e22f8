// Package webhook delivers the webhook events of calls: it signs each
// message per the Standard Webhooks spec (https://www.standardwebhooks.com)
// with its team's secret, sends it, and retries it with exponential backoff
// until a 2xx answer or until retryFor has passed since it was queued.
//
// The messages themselves are in the store's durable outbox (store.Outbox),
// queued by the call write that makes them due, in the same commit: a
// daemon killed between a call's completion and its delivery delivers after
// its restart (at least once; a receiver dedupes by webhook-id, which is the
// same on every attempt). The Deliverer is the outbox's only reader. It runs
// beside the scheduler and never holds it up: the store tells it of new
// messages through a hook that only appends to a list, and shutting down
// abandons the attempts in flight, which stay queued.
//
// Policy decides which destinations a webhook may have (config
// webhook.allow): checked when a call is started, and again on every
// connection, against the address actually dialed, so that a host name
// that resolves to a refused address is refused too.
package webhook
