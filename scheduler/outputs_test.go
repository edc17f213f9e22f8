package scheduler

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"inferd/store"
)

// recordingOutputs is an OutputSink that records what it heard, in order.
type recordingOutputs struct {
	mu     sync.Mutex
	events []string
}

func (o *recordingOutputs) CallRunning(id string) { o.add("running " + id) }
func (o *recordingOutputs) CallOutput(id string, line json.RawMessage) {
	o.add("output " + id + " " + string(line))
}
func (o *recordingOutputs) add(e string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
}

// A streamed reply's lines reach the OutputSink as the model sends them,
// and the stored call is marked streamed, its outputs the list of lines.
func TestStreamedOutputReachesTheSinkAndMarksTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("stream", minMax(1, 1))
		outs := &recordingOutputs{}
		h := newHarness(t, Config{Outputs: outs}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		c, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		fc := h.call(i)
		fc.stream.Begin()
		fc.stream.Line(json.RawMessage(`{"t":1}`))
		fc.stream.Line(json.RawMessage(`{"t":2}`))
		fc.reply(`[{"t":1},{"t":2}]`)
		h.settle()
		want := []string{"running " + c.ID, "output " + c.ID + ` {"t":1}`, "output " + c.ID + ` {"t":2}`}
		if !slices.Equal(outs.events, want) {
			t.Errorf("sink heard:\n%s\nwant:\n%s", strings.Join(outs.events, "\n"), strings.Join(want, "\n"))
		}
		got, _ := h.st.call(c.ID)
		if got.State != store.CallSucceeded || !got.Streamed || string(got.Outputs) != `[{"t":1},{"t":2}]` {
			t.Errorf("stored call %+v, want succeeded, streamed, outputs the lines", got)
		}
	})
}

// The tokens a model reports for a call (an OpenAI-compatible server's
// usage) are kept in its final record, and in its usage ledger entry (what
// the roll-ups add); a call whose model reports none has none.
func TestReportedTokensAreKeptWithTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("llm", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		metered, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		fc := h.call(i)
		fc.meter.Tokens(store.Tokens{Prompt: 7, Completion: 3})
		fc.reply(`{"usage":{}}`)
		h.settle()
		plain, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		h.call(i).reply(`{}`)
		h.settle()
		got, _ := h.st.call(metered.ID)
		if got.Tokens == nil || *got.Tokens != (store.Tokens{Prompt: 7, Completion: 3}) {
			t.Errorf("stored tokens %+v, want 7 prompt and 3 completion", got.Tokens)
		}
		if u := got.Usage; u == nil || u.PromptTokens != 7 || u.CompletionTokens != 3 {
			t.Errorf("the call's usage %+v, want 7 prompt and 3 completion tokens", u)
		}
		if got, _ := h.st.call(plain.ID); got.Tokens != nil || got.Usage == nil || got.Usage.PromptTokens != 0 || got.Usage.CompletionTokens != 0 {
			t.Errorf("a call without reported usage stored tokens %+v, usage %+v", got.Tokens, got.Usage)
		}
	})
}

// A start's route and idempotency key are kept with the call, and the
// route reaches the model's Infer.
func TestStartRouteReachesTheInfer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("routed", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		c, err := h.s.Start(context.Background(), p, Request{Inputs: json.RawMessage(`{}`), Route: "/second", IdempotencyKey: "req-9"})
		if err != nil {
			t.Fatal(err)
		}
		fc := h.call(i)
		if fc.route != "/second" {
			t.Errorf("Infer's route %q, want /second", fc.route)
		}
		fc.reply(`{}`)
		h.settle()
		if got, err := h.st.CallByIdempotencyKey(p.TeamID, "req-9"); err != nil || got.ID != c.ID || got.Route != "/second" {
			t.Errorf("CallByIdempotencyKey = %+v, %v", got, err)
		}
	})
}
