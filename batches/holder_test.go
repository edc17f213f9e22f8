package batches

import (
	"strings"
	"testing"
)

// In cluster mode every id a Manager makes (a file, a batch, its output
// and error files) names its node, and Holder reads it back; on a box
// (Node "") ids are as OpenAI's look and name no node.
func TestIDsNameTheNodeThatHoldsThem(t *testing.T) {
	for _, node := range []string{"box-2", ""} {
		t.Run("node "+node, func(t *testing.T) {
			sched := newFakeSched()
			m := startManagerWith(t, Config{Dir: t.TempDir(), Sched: sched, Store: fakeStore{llm(), sched}, Node: node})
			f, err := m.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(1, chatLine)))
			if err != nil {
				t.Fatal(err)
			}
			b, err := m.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
			if err != nil {
				t.Fatal(err)
			}
			waitPending(t, sched, 1)
			sched.answerAll(func(n int) bool { return n != 0 })
			b = waitStatus(t, m.Manager, "acme", b.ID, StatusCompleted)
			for _, id := range []string{f.ID, b.ID, *b.ErrorFileID} {
				if got := Holder(id); got != node {
					t.Errorf("Holder(%q) = %q, want %q", id, got, node)
				}
			}
		})
	}
}

func TestHolder(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{"file-node-1.0a1b", "node-1"},
		{"file-node-1.0a1b-out", "node-1"},
		{"batch_n3.ff", "n3"},
		{"file-0a1b2c", ""},
		{"batch_0a1b2c", ""},
		{"call_x.y", ""},
		{"file-.abc", ""},
		{"", ""},
	} {
		if got := Holder(tc.id); got != tc.want {
			t.Errorf("Holder(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
}
