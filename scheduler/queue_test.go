package scheduler

import (
	"fmt"
	"slices"
	"testing"

	"inferd/store"
)

func TestFIFOKeepsOrderThroughPopsRemovesAndRequeues(t *testing.T) {
	var q fifo
	calls := make([]*call, 200)
	for i := range calls {
		calls[i] = &call{c: store.Call{ID: fmt.Sprint(i)}}
		q.push(calls[i])
	}
	ids := func() []string {
		var out []string
		for i := q.head; i < len(q.items); i++ {
			out = append(out, q.items[i].c.ID)
		}
		return out
	}
	for i := range 150 { // past the compaction threshold
		if got := q.pop(); got != calls[i] {
			t.Fatalf("pop %d = %s", i, got.c.ID)
		}
	}
	if !q.remove(calls[160]) || q.remove(calls[160]) {
		t.Fatal("remove did not take the call out exactly once")
	}
	q.pushFront(calls[149])
	if q.len() != 50 || q.peek() != calls[149] {
		t.Fatalf("len %d, head %s", q.len(), q.peek().c.ID)
	}
	got := ids()
	if got[0] != "149" || got[1] != "150" || slices.Contains(got, "160") || got[len(got)-1] != "199" {
		t.Errorf("queue = %v", got)
	}
	all := q.drain()
	if len(all) != 50 || q.len() != 0 || q.peek() != nil {
		t.Errorf("drain returned %d, left %d", len(all), q.len())
	}
	q.pushFront(calls[0]) // into an empty queue
	if q.pop() != calls[0] {
		t.Error("pushFront into an empty queue lost the call")
	}
}

func TestRecentFailuresForgetsOldestBeyondBound(t *testing.T) {
	f := newRecentFailures(3)
	for i := range 5 {
		f.add(store.Call{ID: fmt.Sprint(i), Message: msgStorageFull})
	}
	for i := range 5 {
		_, ok := f.get(fmt.Sprint(i))
		if want := i >= 2; ok != want {
			t.Errorf("call %d kept = %v, want %v", i, ok, want)
		}
	}
	if len(f.calls) != 3 {
		t.Errorf("%d kept, want 3", len(f.calls))
	}
}
