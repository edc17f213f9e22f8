// Package webhook delivers the webhook events of calls: it signs each
// message per the Standard Webhooks spec (https://www.standardwebhooks.com)
// with its team's secret, stamped with the time of the attempt, sends it,
// and retries it with exponential backoff until a 2xx answer or until
// retryFor has passed since it was queued.
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
// Teams share the deliverer without slowing each other (backlog.go): a
// team has at most SendersPerTeam attempts in flight, so a receiver that
// never answers holds its own team's share only, and a freed sender goes to
// the team with the fewest in flight. A team holds at most
// MaxPendingPerTeam messages; over it, its oldest waiting message is
// dropped (ended unsent, its lastError saying why, counted in Stats).
//
// Policy decides which destinations a webhook may have (config
// webhook.allow): checked when a call is started, and again on every
// connection, against the address actually dialed, so that a host name
// that resolves (or rebinds) to a refused address is refused too. The
// forbidden addresses (link-local, cloud metadata) are refused whatever
// webhook.allow says.
package webhook
