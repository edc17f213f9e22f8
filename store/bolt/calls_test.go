package bolt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

// Concurrent writers share group commits; storetest checks that their
// writes are durable.
func TestCommitStatsCountGroupCommits(t *testing.T) {
	s := openTest(t)
	const goroutines, perG = 64, 20
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				c := store.Call{ID: newCallID(), ProjectID: "p", State: store.CallQueued,
					Inputs: json.RawMessage(fmt.Sprintf(`{"g":%d,"i":%d}`, g, i))}
				if err := s.SaveCall(context.Background(), c); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	st := s.CommitStats()
	if st.Writes != goroutines*perG || st.Commits < 1 || st.Commits > st.Writes || st.Duration <= 0 {
		t.Errorf("CommitStats = %+v", st)
	}
	t.Logf("%d writes in %d commits", st.Writes, st.Commits)
}

func TestExpireCallsWorksInChunks(t *testing.T) {
	s := openTest(t)
	const n = 2*expireChunk + 17
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	errs := make(chan error, n)
	for i := range n {
		s.SaveCallAsync(store.Call{ID: newCallID(), State: store.CallSucceeded, Finished: t0.Add(time.Duration(i))},
			func(err error) { errs <- err })
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ExpireCalls(t0.Add(time.Hour))
	if err != nil || got != n {
		t.Errorf("ExpireCalls = %d, %v; want %d", got, err, n)
	}
}

func TestRunSweeperExpiresOldCallsUntilCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := Open(testPath(t), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithCancel(t.Context())
		if err := s.SaveCall(ctx, store.Call{ID: "call_old", State: store.CallSucceeded, Finished: time.Now()}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error)
		go func() { done <- s.RunSweeper(ctx, time.Hour, time.Minute, nil) }()

		time.Sleep(59 * time.Minute) // fake time inside the bubble
		synctest.Wait()
		if _, err := s.GetCall("call_old"); err != nil {
			t.Fatalf("call expired before its TTL: %v", err)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if _, err := s.GetCall("call_old"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("call not expired after its TTL: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunSweeper = %v, want nil after cancel", err)
		}
	})
}

func TestFullDiskFailsTheWriteAndTheWriterGoesOn(t *testing.T) {
	s := openAt(t, testPath(t), Options{maxSize: 1 << 20})
	big := json.RawMessage(`"` + strings.Repeat("x", 2<<20) + `"`)
	err := s.SaveCall(context.Background(), store.Call{ID: newCallID(), State: store.CallQueued, Inputs: big})
	if !errors.Is(err, store.ErrStorageFull) {
		t.Fatalf("SaveCall(too big) = %v, want ErrStorageFull", err)
	}
	id := newCallID()
	if err := s.SaveCall(context.Background(), store.Call{ID: id, State: store.CallQueued}); err != nil {
		t.Fatalf("SaveCall after a full-disk failure = %v", err)
	}
	if _, err := s.GetCall(id); err != nil {
		t.Error(err)
	}
}

// The applier lingers for more writes to copy into the data file together,
// but a webhook delivery is sent only once its write is there: a write that
// makes one due cuts the linger to deliveryLinger, also when it comes while
// the applier already lingers over other writes.
func TestWebhookDeliveryWaitsOnlyTheShortLinger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := Open(testPath(t), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		queued := make(chan time.Time, 1)
		s.OnDeliveryQueued(func(store.Delivery) { queued <- time.Now() })
		start := time.Now()
		plain := store.Call{ID: newCallID(), TeamID: "t", State: store.CallSucceeded}
		if err := s.SaveCall(t.Context(), plain); err != nil {
			t.Fatal(err)
		}
		time.Sleep(deliveryLinger / 2) // the applier lingers over the plain write
		hooked := store.Call{ID: newCallID(), TeamID: "t", State: store.CallSucceeded, Webhook: "https://example.com/hook"}
		if err := s.SaveCall(t.Context(), hooked); err != nil {
			t.Fatal(err)
		}
		if waited := (<-queued).Sub(start); waited > deliveryLinger || applyLinger <= deliveryLinger {
			t.Errorf("delivery queued %v after the first write; want at most %v (the linger without one is %v)", waited, deliveryLinger, applyLinger)
		}
	})
}

// A transaction applies at most applyBytes of payloads, or one write
// larger than that alone: bbolt's commit allocates its pages at once, and
// a write's payload is garbage only once its transaction is done (issue
// 41: sixteen 60 MiB replies in one transaction held a gigabyte).
func TestAppliesTakeOneLargePayloadATransaction(t *testing.T) {
	p := newPending(0)
	big := func(id string) callWrite {
		return callWrite{key: []byte(id), value: []byte(`{}`), outputs: make([]byte, applyBytes)}
	}
	small := func(id string) callWrite { return callWrite{key: []byte(id), value: []byte(`{}`)} }
	hooked := small("s3")
	hooked.deliveries = []store.Delivery{{}}
	p.add([]callWrite{small("s1"), big("b1"), big("b2"), small("s2"), hooked}, 1)
	var got [][]string
	p.mu.Lock()
	for len(p.queue) > 0 {
		var ids []string
		for _, l := range p.cutBatch() {
			ids = append(ids, string(l.cw.key))
		}
		got = append(got, ids)
		if len(p.queue) > 0 && p.due != 1 {
			t.Errorf("after %v: %d writes left that make deliveries due; want 1", ids, p.due)
		}
	}
	p.mu.Unlock()
	want := [][]string{{"s1"}, {"b1"}, {"b2"}, {"s2", "s3"}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("transactions %v; want %v", got, want)
	}
}

// An append logs at most maxHeldBytes of payloads, or one write larger
// than that alone: the writer checks the bound on held writes before each
// append, and two 60 MiB replies logged together would both be held past
// it (issue 41). Small writes share one append, as before.
func TestAppendsLogOneLargePayloadAtATime(t *testing.T) {
	w := func(payload int) callWrite {
		return callWrite{key: []byte("c"), value: []byte(`{}`), outputs: make([]byte, payload)}
	}
	for _, tc := range []struct {
		name   string
		queued []callWrite
		want   []int
	}{
		{"small writes together", []callWrite{w(0), w(10), w(100)}, []int{3}},
		{"two large replies apart", []callWrite{w(maxHeldBytes), w(maxHeldBytes)}, []int{1, 1}},
		{"a large one alone between small ones", []callWrite{w(10), w(maxHeldBytes), w(10), w(10)}, []int{1, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			for rest := tc.queued; len(rest) > 0; {
				n := groupSize(rest)
				got = append(got, n)
				rest = rest[n:]
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("appends of %v writes; want %v", got, tc.want)
			}
		})
	}
}

// The applier lingers over small writes only: a write whose payload brings
// the held writes to applyBytes is copied into the data file at once, since
// each byte held is memory until then.
func TestLargeHeldWritesAreAppliedWithoutLingering(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := Open(testPath(t), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		applied := func() bool {
			synctest.Wait() // the applier has applied, or lingers on its timer
			s.pend.mu.Lock()
			defer s.pend.mu.Unlock()
			return s.pend.applied == s.pend.logged
		}
		small := store.Call{ID: newCallID(), TeamID: "t", State: store.CallQueued, Inputs: json.RawMessage(`{"x":1}`)}
		if err := s.SaveCall(t.Context(), small); err != nil {
			t.Fatal(err)
		}
		if applied() || applyLinger == 0 {
			t.Fatal("a small write was applied without the linger: this test cannot tell")
		}
		big := store.Call{ID: newCallID(), TeamID: "t", State: store.CallQueued,
			Inputs: json.RawMessage(`{"x":"` + strings.Repeat("a", applyBytes) + `"}`)}
		if err := s.SaveCall(t.Context(), big); err != nil {
			t.Fatal(err)
		}
		if !applied() {
			t.Errorf("%d bytes held, still lingering: want them applied at once", len(big.Inputs))
		}
	})
}
