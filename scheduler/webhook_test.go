package scheduler

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
	"inferd/store/storetest"
)

// A start's webhook is kept with the call, so that the call's writes queue
// its deliveries: start when a replica takes it, completed with its result,
// for a synchronous start that finished within its wait (one write) too.
func TestStartWebhookQueuesDeliveriesWithTheCallsWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("hooked", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		opts := Request{Inputs: json.RawMessage(`{}`), Webhook: "http://127.0.0.1:9/h", WebhookEvents: []string{store.EventStart, store.EventCompleted}}

		async, err := h.s.Start(context.Background(), p, opts)
		if err != nil {
			t.Fatal(err)
		}
		fc := h.call(i)
		h.settle()
		if got := storetest.PendingDeliveryIDs(t, h.st); !slices.Equal(got, []string{store.DeliveryID(async.ID, store.EventStart)}) {
			t.Fatalf("running async call: outbox %v, want its start event", got)
		}
		fc.reply(`{"y":1}`)
		h.settle()

		res := make(chan store.Call, 1)
		go func() {
			sync := opts
			sync.Wait = time.Minute
			c, _ := h.s.Start(context.Background(), p, sync)
			res <- c
		}()
		h.call(i).reply(`{"y":2}`)
		sync := <-res
		h.settle()
		want := []string{
			store.DeliveryID(async.ID, store.EventCompleted), store.DeliveryID(async.ID, store.EventStart),
			store.DeliveryID(sync.ID, store.EventCompleted), store.DeliveryID(sync.ID, store.EventStart),
		}
		slices.Sort(want)
		if got := storetest.PendingDeliveryIDs(t, h.st); !slices.Equal(got, want) {
			t.Errorf("outbox %v, want %v", got, want)
		}
		if c, _ := h.st.call(sync.ID); c.Webhook != opts.Webhook || !slices.Equal(c.WebhookEvents, opts.WebhookEvents) {
			t.Errorf("stored call lost its webhook: %q %v", c.Webhook, c.WebhookEvents)
		}
	})
}
