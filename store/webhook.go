package store

import (
	"crypto/rand"
	"encoding/base64"
	"slices"
	"strings"
	"sync"
	"time"
)

// Webhook events a call may ask for (its WebhookEvents).
const (
	// EventStart is sent when a replica takes the call.
	EventStart = "start"
	// EventCompleted is sent when the call's result is durable.
	EventCompleted = "completed"
)

// Delivery is one webhook message in the durable outbox: the call write
// that makes it due queues it in the same commit (so a crash between a
// call's completion and its delivery loses nothing), and it stays pending
// until a deliverer ends it (delivered, or given up).
//
// Its ID is the Standard Webhooks webhook-id, the same on every attempt. It
// is derived from the call and the event, so a call written twice in the
// same state queues its delivery once: a store keeps an ended delivery's ID
// until the call expires, and never queues an ID it holds.
type Delivery struct {
	ID          string    `json:"id"`
	CallID      string    `json:"callId"`
	TeamID      string    `json:"teamId"`
	Event       string    `json:"event"`
	URL         string    `json:"url"`
	Created     time.Time `json:"created"`
	Attempts    int       `json:"attempts"`
	NextAttempt time.Time `json:"nextAttempt"`
	LastError   string    `json:"lastError,omitempty"`
	// Ended is set once the delivery is delivered or given up; Delivered
	// says which.
	Ended     time.Time `json:"ended,omitzero"`
	Delivered bool      `json:"delivered,omitempty"`
}

// DeliveryID is the webhook-id of call callID's event.
func DeliveryID(callID, event string) string {
	return "msg_" + strings.TrimPrefix(callID, "call_") + "_" + event
}

// WantsEvent reports whether c asked for webhook event ev. A call with a
// webhook and no events asked for the default, completed.
func (c Call) WantsEvent(ev string) bool {
	if c.Webhook == "" {
		return false
	}
	if len(c.WebhookEvents) == 0 {
		return ev == EventCompleted
	}
	return slices.Contains(c.WebhookEvents, ev)
}

// DeliveriesFor returns the deliveries a write of c makes due, stamped now:
// start once the call has been dispatched (a call that finished within a
// synchronous start was never written running, so its final write queues
// start too), completed once it is final. The store queues those whose ID
// it does not hold yet.
func DeliveriesFor(c Call, now time.Time) []Delivery {
	var ds []Delivery
	add := func(ev string) {
		ds = append(ds, Delivery{
			ID: DeliveryID(c.ID, ev), CallID: c.ID, TeamID: c.TeamID, Event: ev,
			URL: c.Webhook, Created: now, NextAttempt: now,
		})
	}
	if !c.Dispatched.IsZero() && c.WantsEvent(EventStart) {
		add(EventStart)
	}
	if c.State.Done() && c.WantsEvent(EventCompleted) {
		add(EventCompleted)
	}
	return ds
}

// Outbox is the durable queue of webhook deliveries. Deliveries are queued
// by call writes (see DeliveriesFor), in the same commit as the call.
type Outbox interface {
	// PendingDeliveries returns every delivery not ended, by ID.
	PendingDeliveries() ([]Delivery, error)
	// UpdateDelivery durably records an attempt on a pending delivery
	// (ErrNotFound if there is none): its attempts, error and next attempt,
	// or its end. An ended delivery is no longer pending; its ID is kept
	// until its call expires, so it is never queued again.
	UpdateDelivery(d Delivery) error
	// OnDeliveryQueued registers fn to be called with each delivery a call
	// write queued, once PendingDeliveries lists it (for bbolt, when the
	// write is applied to the data file, a few milliseconds after SaveCall
	// returned), on the store's goroutine: fn must not block or call the
	// store.
	OnDeliveryQueued(fn func(Delivery))
	// WebhookSecret returns the team's webhook signing secret, drawing one
	// first if the team has none or rotate is set (the old one then stops
	// signing at once). An unknown team is ErrNotFound.
	WebhookSecret(teamID string, rotate bool) (string, error)
}

// NewWebhookSecret draws a signing secret in the Standard Webhooks form:
// "whsec_" and the base64 of 32 random bytes, which are the HMAC key.
func NewWebhookSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "whsec_" + base64.StdEncoding.EncodeToString(b[:])
}

// DeliveryHooks keeps the functions registered with OnDeliveryQueued; an
// implementation embeds it and calls Notify after each commit that queued
// deliveries. The zero value is ready to use.
type DeliveryHooks struct {
	mu    sync.RWMutex
	hooks []func(Delivery)
}

// OnDeliveryQueued implements Outbox.
func (h *DeliveryHooks) OnDeliveryQueued(fn func(Delivery)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hooks = append(h.hooks, fn)
}

// Notify runs the hooks, in registration order, for each of ds.
func (h *DeliveryHooks) Notify(ds []Delivery) {
	if len(ds) == 0 {
		return
	}
	h.mu.RLock()
	hooks := h.hooks
	h.mu.RUnlock()
	for _, d := range ds {
		for _, fn := range hooks {
			fn(d)
		}
	}
}
