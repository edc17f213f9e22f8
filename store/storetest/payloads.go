package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

// payloadOfSize returns a JSON object of exactly n bytes (n >= 10), its
// bytes varying with seed so that a chunk read out of place shows.
func payloadOfSize(n int, seed byte) json.RawMessage {
	var b strings.Builder
	b.WriteString(`{"d":"`)
	for i := 0; b.Len() < n-2; i++ {
		b.WriteByte('a' + (seed+byte(i%23))%26)
	}
	b.WriteString(`"}`)
	return json.RawMessage(b.String())
}

// testPayloadsRoundTripByteForByte: inputs and outputs of every size, small
// (kept with the record) and large, come back as the very bytes written
// (not re-encoded: spacing is kept), from
// GetCall, CallInputs and GetCallResult, and GetCallResult and
// PendingCalls leave the inputs out but say their size.
func testPayloadsRoundTripByteForByte(t *testing.T, e *env) {
	s := e.open(t)
	for _, n := range []int{0, 16, 64<<10 - 1, 64 << 10, 64<<10 + 1, 300 << 10} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var in json.RawMessage
			if n > 0 {
				in = payloadOfSize(n, byte(n))
			}
			// Spacing inside the value shows it was not encoded again; small
			// and large outputs alike.
			out := json.RawMessage(`{ "echo" : ` + string(payloadOfSize(max(n, 16), 3)) + ` }`)
			c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued, Inputs: in, Created: e.clock.Now()}
			if err := s.SaveCall(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			got, err := s.CallInputs(c.ID)
			if err != nil || !bytes.Equal(got, in) {
				t.Fatalf("CallInputs = %d bytes, %v; want the %d written", len(got), err, len(in))
			}
			pending, err := s.PendingCalls()
			if err != nil {
				t.Fatal(err)
			}
			var p *store.Call
			for i := range pending {
				if pending[i].ID == c.ID {
					p = &pending[i]
				}
			}
			if p == nil || p.Inputs != nil || p.InputBytes != int64(n) {
				t.Fatalf("PendingCalls has %+v; want the call without inputs, InputBytes %d", p, n)
			}

			c.State, c.Inputs, c.Outputs, c.Message = store.CallSucceeded, nil, out, "success"
			if err := s.SaveCall(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			r, err := s.GetCallResult(c.ID)
			if err != nil || r.State != store.CallSucceeded || !bytes.Equal(r.Outputs, out) || r.Inputs != nil || r.InputBytes != int64(n) {
				t.Fatalf("GetCallResult = %s, %d bytes of outputs (as written: %v), inputs %d bytes, InputBytes %d, %v; want succeeded, the outputs as written, no inputs, InputBytes %d",
					r.State, len(r.Outputs), bytes.Equal(r.Outputs, out), len(r.Inputs), r.InputBytes, err, n)
			}
			full, err := s.GetCall(c.ID)
			if err != nil || !bytes.Equal(full.Inputs, in) || !bytes.Equal(full.Outputs, out) {
				t.Fatalf("GetCall = %d bytes of inputs, %d of outputs, %v; want both as written", len(full.Inputs), len(full.Outputs), err)
			}
		})
	}
}

// testWriteWithoutInputsKeepsThemOutputsReplaced: the scheduler drops a
// queued call's inputs once they are durable, so its later writes carry
// none; the stored inputs stay. Outputs are what the last write says.
func testWriteWithoutInputsKeepsThemOutputsReplaced(t *testing.T, e *env) {
	for _, n := range []int{40, 100 << 10} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { writeWithoutInputs(t, e, n) })
	}
}

func writeWithoutInputs(t *testing.T, e *env, n int) {
	s := e.open(t)
	in := payloadOfSize(n, 7)
	c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued, Inputs: in, Created: e.clock.Now()}
	steps := []store.Call{c}
	c.Inputs, c.State = nil, store.CallRunning
	steps = append(steps, c)
	c.Outputs = json.RawMessage(`{"partial":true}`)
	steps = append(steps, c)
	c.State, c.Outputs, c.Message = store.CallFailed, nil, "error: model exited"
	steps = append(steps, c)
	for i, step := range steps {
		if err := s.SaveCall(context.Background(), step); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	got, err := s.GetCall(c.ID)
	if err != nil || !bytes.Equal(got.Inputs, in) || got.Outputs != nil || got.State != store.CallFailed {
		t.Errorf("GetCall = %d bytes of inputs, outputs %q, state %s, %v; want the first write's inputs, no outputs, failed", len(got.Inputs), got.Outputs, got.State, err)
	}
	if r, err := s.GetCallResult(c.ID); err != nil || r.Outputs != nil {
		t.Errorf("GetCallResult outputs = %q, %v; want none", r.Outputs, err)
	}
	// The same after a reopen: nothing lived in memory only.
	s = e.reopen(t, s)
	if got, err := s.CallInputs(c.ID); err != nil || !bytes.Equal(got, in) {
		t.Errorf("CallInputs after reopen = %d bytes, %v; want %d", len(got), err, len(in))
	}
}

// testPayloadReadsOfUnknownOrExpiredCalls: an unknown call's payloads are
// ErrNotFound, and an expired call's payloads go with it.
func testPayloadReadsOfUnknownOrExpiredCalls(t *testing.T, e *env) {
	s := e.open(t)
	if _, err := s.CallInputs(newCallID()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CallInputs(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.GetCallResult(newCallID()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetCallResult(unknown) = %v, want ErrNotFound", err)
	}
	c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Inputs: payloadOfSize(70<<10, 1),
		Outputs: payloadOfSize(70<<10, 2), Message: "success", Created: e.clock.Now()}
	if err := s.SaveCall(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)
	if n, err := s.ExpireCalls(e.clock.Now()); err != nil || n != 1 {
		t.Fatalf("ExpireCalls = %d, %v; want 1", n, err)
	}
	if _, err := s.CallInputs(c.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CallInputs(expired) = %v, want ErrNotFound", err)
	}
	if _, err := s.GetCallResult(c.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetCallResult(expired) = %v, want ErrNotFound", err)
	}
}

// testFinalWriteWithPayloadsReadsBackEverywhere: a call's final write that
// carries its inputs and outputs (a sync start's one write, or a queued
// call's last, carrying the small inputs the scheduler kept), with
// payloads on both sides of SmallPayload (what a store may keep in the
// record), reads back through every read: GetCall whole, GetCallResult
// and CallByIdempotencyKey with the outputs and the inputs' size only,
// CallInputs, RecentCalls without either; the same after a reopen. Outputs
// an earlier write left are replaced, and a final write without outputs
// leaves none.
func testFinalWriteWithPayloadsReadsBackEverywhere(t *testing.T, e *env) {
	s := e.open(t)
	type written struct {
		c            store.Call
		in, out      json.RawMessage
		earlierWrite bool
	}
	var calls []written
	for _, n := range []int{16, store.SmallPayload, store.SmallPayload + 1} {
		in, out := payloadOfSize(n, 1), json.RawMessage(`{ "reply" : `+string(payloadOfSize(n, 2))+` }`)
		for _, earlier := range []bool{false, true} {
			c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", Created: e.clock.Now(), Inputs: in,
				IdempotencyKey: fmt.Sprintf("k-%d-%v", n, earlier)}
			if earlier {
				// Queued with its inputs, then running with partial outputs.
				c.State = store.CallQueued
				if err := s.SaveCall(context.Background(), c); err != nil {
					t.Fatal(err)
				}
				c.State, c.Outputs = store.CallRunning, json.RawMessage(`{"partial":true}`)
				if err := s.SaveCall(context.Background(), c); err != nil {
					t.Fatal(err)
				}
			}
			c.State, c.Outputs, c.Message, c.Finished = store.CallSucceeded, out, "success", e.clock.Now()
			if err := s.SaveCall(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			calls = append(calls, written{c, in, out, earlier})
		}
	}
	// Failed with no outputs after partial ones: none are left.
	failed := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", Created: e.clock.Now(), State: store.CallRunning,
		Inputs: payloadOfSize(40, 3), Outputs: json.RawMessage(`{"partial":true}`)}
	if err := s.SaveCall(context.Background(), failed); err != nil {
		t.Fatal(err)
	}
	failed.State, failed.Outputs, failed.Message, failed.Finished = store.CallFailed, nil, "error: model exited", e.clock.Now()
	if err := s.SaveCall(context.Background(), failed); err != nil {
		t.Fatal(err)
	}
	calls = append(calls, written{failed, failed.Inputs, nil, true})

	check := func(s store.Store, when string) {
		t.Helper()
		for _, w := range calls {
			what := fmt.Sprintf("%s, %d bytes of inputs, earlier writes %v", when, len(w.in), w.earlierWrite)
			full, err := s.GetCall(w.c.ID)
			if err != nil || !bytes.Equal(full.Inputs, w.in) || !bytes.Equal(full.Outputs, w.out) || full.State != w.c.State {
				t.Errorf("%s: GetCall = %s, %d bytes of inputs (as written: %v), outputs %.40q, %v; want %s with both as written",
					what, full.State, len(full.Inputs), bytes.Equal(full.Inputs, w.in), full.Outputs, err, w.c.State)
			}
			r, err := s.GetCallResult(w.c.ID)
			if err != nil || r.Inputs != nil || r.InputBytes != int64(len(w.in)) || !bytes.Equal(r.Outputs, w.out) {
				t.Errorf("%s: GetCallResult = inputs %d bytes, InputBytes %d, outputs %.40q, %v; want no inputs, InputBytes %d, the outputs",
					what, len(r.Inputs), r.InputBytes, r.Outputs, err, len(w.in))
			}
			if in, err := s.CallInputs(w.c.ID); err != nil || !bytes.Equal(in, w.in) {
				t.Errorf("%s: CallInputs = %d bytes, %v; want the %d written", what, len(in), err, len(w.in))
			}
			if w.c.IdempotencyKey != "" {
				k, err := s.CallByIdempotencyKey("t", w.c.IdempotencyKey)
				if err != nil || k.ID != w.c.ID || k.Inputs != nil || k.InputBytes != int64(len(w.in)) || !bytes.Equal(k.Outputs, w.out) {
					t.Errorf("%s: CallByIdempotencyKey = %s, inputs %d bytes, InputBytes %d, %v; want %s without inputs, InputBytes %d, the outputs",
						what, k.ID, len(k.Inputs), k.InputBytes, err, w.c.ID, len(w.in))
				}
			}
		}
		recent, err := s.RecentCalls("t", 100)
		if err != nil || len(recent) != len(calls) {
			t.Fatalf("%s: RecentCalls = %d calls, %v; want %d", when, len(recent), err, len(calls))
		}
		for _, c := range recent {
			if c.Inputs != nil || c.Outputs != nil {
				t.Errorf("%s: RecentCalls has %s with inputs %d bytes, outputs %d bytes; want neither", when, c.ID, len(c.Inputs), len(c.Outputs))
			}
		}
	}
	check(s, "written")
	check(e.reopen(t, s), "after reopen")
}
