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
