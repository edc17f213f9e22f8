package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"unsafe"

	"inferd/store"
)

// A queued call keeps only its metadata in memory once its first write has
// committed: its inputs, unless small, are read back from the store when it
// is dispatched.
func TestQueuedCallKeepsNoInputsAndReadsThemAtDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("big", minMax(0, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		inputs := `{"image":"` + strings.Repeat("A", 100<<10) + `"}`
		c := h.submit(p, inputs)
		live, _, err := h.s.Lookup(c.ID)
		if err != nil || live.State != store.CallBooting {
			t.Fatalf("Lookup = %+v, %v; want the call booting", live.State, err)
		}
		if live.Inputs != nil {
			t.Errorf("a queued durable call holds %d bytes of inputs in memory", len(live.Inputs))
		}
		i := h.launched()
		h.ready(i)
		fc := h.call(i)
		if string(fc.inputs) != inputs {
			t.Fatalf("the model got %d bytes of inputs, want the %d submitted", len(fc.inputs), len(inputs))
		}
		fc.reply(`{"ok":true}`)
		if got := h.result(c.ID); got.State != store.CallSucceeded || string(got.Outputs) != `{"ok":true}` {
			t.Errorf("result = %+v", got)
		}
	})
}

// Inputs that cannot be read back at dispatch fail the call with a message
// saying so, rather than sending the model nothing.
func TestUnreadableInputsFailTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("big", minMax(0, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		c := h.submit(p, `{"x":"`+strings.Repeat("x", store.SmallPayload)+`"}`)
		h.st.failInputs(errors.New("disk on fire"))
		i := h.launched()
		h.ready(i)
		h.noCall(i)
		if got := h.result(c.ID); got.State != store.CallFailed || got.Message != msgInputsUnreadable {
			t.Errorf("result = %s %q, want failed %q", got.State, got.Message, msgInputsUnreadable)
		}
	})
}

// The queued bytes of a project are capped: a call that would take them over
// is refused with how many bytes wait, and a dispatched call gives its bytes
// back.
func TestSubmitRejectsCallWhenQueuedBytesAreFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("big", minMax(0, 1))
		h := newHarness(t, Config{MaxQueuedBytesPerProject: 100}, nil, p)
		defer h.stop()
		sixty := `{"d":"` + strings.Repeat("x", 52) + `"}`
		first := h.submit(p, sixty)
		_, err := h.s.Submit(context.Background(), p, json.RawMessage(sixty))
		if want := "queue full (60 bytes waiting); retry later"; !errors.Is(err, ErrQueueFull) || err == nil || err.Error() != want {
			t.Fatalf("Submit over the byte cap = %v, want %q wrapping ErrQueueFull", err, want)
		}
		forty := `{"d":"` + strings.Repeat("x", 32) + `"}`
		h.submit(p, forty) // exactly at the cap
		i := h.launched()
		h.ready(i)
		fc := h.call(i) // first leaves the queue: 40 bytes wait
		h.submit(p, sixty)
		fc.reply(`{}`)
		if got := h.result(first.ID); got.State != store.CallSucceeded {
			t.Errorf("first = %+v", got)
		}
	})
}

// Lookups of a finished call with a large result share one copy of its
// outputs, read from the store once, for as long as shareFor after the read.
func TestLookupsOfALargeResultShareOneCopy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("big", minMax(0, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		out := `{"d":"` + strings.Repeat("x", shareMinBytes) + `"}`
		h.st.putCall(store.Call{ID: "call_done", ProjectID: "big", State: store.CallSucceeded, Outputs: json.RawMessage(out), Message: "success"})
		h.st.resultReads.Store(0)
		a, _, err := h.s.Lookup("call_done")
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := h.s.Lookup("call_done")
		if err != nil {
			t.Fatal(err)
		}
		if string(b.Outputs) != out || b.State != store.CallSucceeded {
			t.Fatalf("second lookup = %s with %d bytes of outputs", b.State, len(b.Outputs))
		}
		if unsafe.SliceData(a.Outputs) != unsafe.SliceData(b.Outputs) || h.st.resultReads.Load() != 1 {
			t.Errorf("two lookups made %d store reads, shared outputs: %v; want 1, true", h.st.resultReads.Load(),
				unsafe.SliceData(a.Outputs) == unsafe.SliceData(b.Outputs))
		}
		h.advance(shareFor)
		if _, _, err := h.s.Lookup("call_done"); err != nil || h.st.resultReads.Load() != 2 {
			t.Errorf("a lookup after shareFor: %d store reads, %v; want a fresh read", h.st.resultReads.Load(), err)
		}
		runtime.KeepAlive(a.Outputs)
	})
}
