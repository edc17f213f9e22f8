package bolt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

func TestSaveCallFromManyGoroutinesIsDurable(t *testing.T) {
	path := testPath(t)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, perG = 64, 20
	ids := make([][]string, goroutines)
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
				ids[g] = append(ids[g], c.ID)
			}
		})
	}
	wg.Wait()
	st := s.CommitStats()
	if st.Writes != goroutines*perG || st.Commits < 1 || st.Commits > st.Writes || st.Duration <= 0 {
		t.Errorf("CommitStats = %+v", st)
	}
	t.Logf("%d writes in %d commits", st.Writes, st.Commits)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openAt(t, path, Options{})
	for g := range goroutines {
		for i, id := range ids[g] {
			c, err := s.GetCall(id)
			if err != nil {
				t.Fatalf("call %s lost after reopen: %v", id, err)
			}
			if want := fmt.Sprintf(`{"g":%d,"i":%d}`, g, i); string(c.Inputs) != want {
				t.Errorf("call %s inputs = %s, want %s", id, c.Inputs, want)
			}
		}
	}
}

func TestSaveCallAsyncAppliesInQueueOrder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		states []store.CallState
	}{
		{"queued running succeeded", []store.CallState{store.CallQueued, store.CallRunning, store.CallSucceeded}},
		{"queued running failed", []store.CallState{store.CallQueued, store.CallRunning, store.CallFailed}},
		{"retried after failure", []store.CallState{store.CallQueued, store.CallFailed, store.CallQueued, store.CallRunning}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openTest(t)
			id := newCallID()
			errs := make(chan error, len(tc.states))
			for i, st := range tc.states {
				s.SaveCallAsync(store.Call{ID: id, State: st, Attempt: i}, func(err error) { errs <- err })
			}
			for range tc.states {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			final := tc.states[len(tc.states)-1]
			c, err := s.GetCall(id)
			if err != nil || c.State != final || c.Attempt != len(tc.states)-1 {
				t.Fatalf("GetCall = %+v, %v; want state %s", c, err, final)
			}
			if final.Done() && c.Finished.IsZero() {
				t.Error("final call saved without Finished did not get one")
			}
			pending, err := s.PendingCalls()
			if err != nil {
				t.Fatal(err)
			}
			if got := len(pending) == 1; got == final.Done() {
				t.Errorf("PendingCalls = %d calls for final state %s", len(pending), final)
			}
		})
	}
}

func TestSaveCallRejectsBadIDAndHonoursContext(t *testing.T) {
	s := openTest(t)
	for _, tc := range []struct {
		name string
		id   string
	}{
		{"empty id", ""},
		{"huge id", string(make([]byte, 200))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ve *store.ValidationError
			if err := s.SaveCall(context.Background(), store.Call{ID: tc.id}); !errors.As(err, &ve) {
				t.Errorf("SaveCall = %v, want a validation error", err)
			}
		})
	}
	t.Run("cancelled context still writes", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		id := newCallID()
		err := s.SaveCall(ctx, store.Call{ID: id, State: store.CallQueued})
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("SaveCall = %v", err)
		}
		// A later durable write of another call is committed after it.
		if err := s.SaveCall(context.Background(), store.Call{ID: newCallID(), State: store.CallQueued}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetCall(id); err != nil {
			t.Errorf("write with a cancelled context was dropped: %v", err)
		}
	})
}

func TestPendingCallsOldestFirst(t *testing.T) {
	s := openTest(t)
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = newCallID()
	}
	order := rand.Perm(len(ids))
	var want []string
	for _, i := range order {
		st := []store.CallState{store.CallQueued, store.CallRunning, store.CallSucceeded, store.CallFailed}[i%4]
		if err := s.SaveCall(context.Background(), store.Call{ID: ids[i], State: st}); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		if i%4 < 2 {
			want = append(want, id)
		}
	}
	got, err := s.PendingCalls()
	if err != nil {
		t.Fatal(err)
	}
	var gotIDs []string
	for _, c := range got {
		gotIDs = append(gotIDs, c.ID)
	}
	if !slices.Equal(gotIDs, want) {
		t.Errorf("PendingCalls = %v\nwant %v", gotIDs, want)
	}
}

func TestExpireCallsDeletesOnlyFinishedBefore(t *testing.T) {
	s := openTest(t)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	save := func(id string, st store.CallState, finished time.Time) {
		t.Helper()
		if err := s.SaveCall(context.Background(), store.Call{ID: id, State: st, Finished: finished}); err != nil {
			t.Fatal(err)
		}
	}
	save("call_a", store.CallSucceeded, t0)
	save("call_b", store.CallFailed, t0.Add(time.Hour))
	save("call_c", store.CallSucceeded, t0.Add(2*time.Hour))
	save("call_d", store.CallQueued, time.Time{})
	save("call_e", store.CallRunning, time.Time{})
	// Re-saved with a later finish time: the old index entry must not expire it.
	save("call_f", store.CallSucceeded, t0)
	save("call_f", store.CallSucceeded, t0.Add(3*time.Hour))
	// Finished, then retried: no longer finished, never expired.
	save("call_g", store.CallFailed, t0)
	save("call_g", store.CallQueued, time.Time{})

	for _, tc := range []struct {
		name   string
		before time.Time
		count  int
		gone   []string
	}{
		{"nothing before t0", t0, 0, nil},
		{"first hour", t0.Add(time.Hour), 1, []string{"call_a"}},
		{"same cut again", t0.Add(time.Hour), 0, []string{"call_a"}},
		{"up to 2h30", t0.Add(150 * time.Minute), 2, []string{"call_a", "call_b", "call_c"}},
		{"far future", t0.Add(1000 * time.Hour), 1, []string{"call_a", "call_b", "call_c", "call_f"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := s.ExpireCalls(tc.before)
			if err != nil || n != tc.count {
				t.Fatalf("ExpireCalls = %d, %v; want %d", n, err, tc.count)
			}
			for _, id := range []string{"call_a", "call_b", "call_c", "call_d", "call_e", "call_f", "call_g"} {
				_, err := s.GetCall(id)
				if gone := slices.Contains(tc.gone, id); gone != errors.Is(err, store.ErrNotFound) {
					t.Errorf("call %s: gone = %v, GetCall err = %v", id, gone, err)
				}
			}
		})
	}
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
		go func() { done <- s.RunSweeper(ctx, time.Hour, time.Minute) }()

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

func TestCloseDrainsQueuedWrites(t *testing.T) {
	path := testPath(t)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	results := make(chan error, n)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = newCallID()
		s.SaveCallAsync(store.Call{ID: ids[i], State: store.CallQueued}, func(err error) { results <- err })
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-results; err != nil {
			t.Fatalf("queued write failed: %v", err)
		}
	}
	s = openAt(t, path, Options{})
	pending, err := s.PendingCalls()
	if err != nil || len(pending) != n {
		t.Errorf("after reopen %d pending calls, %v; want %d", len(pending), err, n)
	}
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
