package batches

import (
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/scheduler"
)

// fakeClock is a scheduler.Clock the test moves: timers fire when it is
// advanced past them.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	// armed are the timers set, by their duration, not yet waited for
	// (waitArmed), so a test waits for the runner to have armed its
	// deadline before it moves the clock; changed is closed at each.
	armed   []time.Duration
	changed chan struct{}
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), changed: make(chan struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) scheduler.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	c.armed = append(c.armed, d)
	close(c.changed)
	c.changed = make(chan struct{})
	return t
}

// waitArmed waits for a timer of d to be set (and takes it off the list).
func (c *fakeClock) waitArmed(t *testing.T, d time.Duration) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		for i, a := range c.armed {
			if a == d {
				c.armed = append(c.armed[:i], c.armed[i+1:]...)
				c.mu.Unlock()
				return
			}
		}
		changed := c.changed
		c.mu.Unlock()
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no timer of %s was set within 10 s (armed: %v, timers %d, now %s)", d, c.armed, len(c.timers), c.now)
		}
	}
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// advance moves the clock by d and runs the timers now due.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	for _, t := range c.timers {
		if !t.stopped && !t.at.After(c.now) {
			t.stopped = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

// A batch ends expired at its window's end however its calls stand (issue
// 41: the runner checked the window only before it submitted a line, and
// its calls had no queue deadline, so a batch whose calls stayed queued
// never ended): its calls carry what is left of the window as their
// queueTimeout, and when the clock passes it the calls still pending are
// ended and the batch is expired, the lines that never ran counted as
// neither completed nor failed and written as batch_expired.
func TestABatchExpiresAtItsDeadlineWithCallsStillQueued(t *testing.T) {
	sched := newFakeSched()
	clock := newFakeClock()
	m := startManagerWith(t, Config{Dir: t.TempDir(), Sched: sched, Store: fakeStore{llm(), sched}, Clock: clock})
	f, _ := m.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(10, chatLine)))
	b, err := m.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
	if err != nil {
		t.Fatal(err)
	}
	clock.waitArmed(t, 24*time.Hour) // the runner's deadline
	waitPending(t, sched, 4)
	sched.answerAll(func(int) bool { return true }) // 4 done; 4 more queued
	waitPending(t, sched, 4)
	sched.mu.Lock()
	timeouts := append([]int(nil), sched.queueTimeouts...)
	sched.mu.Unlock()
	for i, qt := range timeouts {
		if qt != 24*3600 {
			t.Errorf("call %d's queueTimeout %d s, want the window's 86400", i, qt)
		}
	}

	clock.advance(24*time.Hour + time.Second)
	b = waitStatus(t, m.Manager, "acme", b.ID, StatusExpired)
	if b.RequestCounts != (RequestCounts{Total: 10, Completed: 4}) || b.ExpiredAt == nil {
		t.Errorf("expired %+v, want 10 lines, 4 completed, none failed", b)
	}
	if sched.pending() != 0 || sched.made() != 8 {
		t.Errorf("%d calls pending of %d made, want none of 8", sched.pending(), sched.made())
	}
	errs := readLines(t, m.Manager, "acme", *b.ErrorFileID)
	if len(errs) != 6 {
		t.Fatalf("%d error lines, want the 6 lines not run", len(errs))
	}
	for _, l := range errs {
		if l.Response != nil || l.Error == nil || l.Error.Code != "batch_expired" {
			t.Errorf("line %s: response %+v error %+v, want batch_expired", l.CustomID, l.Response, l.Error)
		}
	}
	if out := readLines(t, m.Manager, "acme", *b.OutputFileID); len(out) != 4 {
		t.Errorf("%d output lines, want 4", len(out))
	}
}

// A batch that ended expired or cancelled stays so across a restart, its
// counts and files as they were, and no call is made for it again; one
// whose window passed while the daemon was down ends expired at start,
// its queued calls ended.
func TestExpiredAndCancelledBatchesStaySoAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	sched := newFakeSched()
	clock := newFakeClock()
	first := startManagerWith(t, Config{Dir: dir, Sched: sched, Store: fakeStore{llm(), sched}, Clock: clock})
	create := func(m *Manager) Batch {
		f, _ := m.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(6, chatLine)))
		b, err := m.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
		if err != nil {
			t.Fatal(err)
		}
		clock.waitArmed(t, 24*time.Hour)
		return b
	}
	cancelled := create(first.Manager)
	waitPending(t, sched, 4)
	if _, err := first.CancelBatch(Team("acme"), cancelled.ID); err != nil {
		t.Fatal(err)
	}
	cancelled = waitStatus(t, first.Manager, "acme", cancelled.ID, StatusCancelled)
	expired := create(first.Manager)
	waitPending(t, sched, 4)
	clock.advance(25 * time.Hour)
	expired = waitStatus(t, first.Manager, "acme", expired.ID, StatusExpired)
	late := create(first.Manager)
	waitPending(t, sched, 4)
	first.stop() // late's calls still queued
	made := sched.made()

	clock.advance(25 * time.Hour) // the daemon down past late's window
	second := startManagerWith(t, Config{Dir: dir, Sched: sched, Store: fakeStore{llm(), sched}, Clock: clock})
	late2 := waitStatus(t, second.Manager, "acme", late.ID, StatusExpired)
	if late2.RequestCounts.Completed != 0 || late2.RequestCounts.Failed != 0 || sched.pending() != 0 {
		t.Errorf("late batch %+v with %d calls pending, want expired with its calls ended, none failed", late2.RequestCounts, sched.pending())
	}
	for _, want := range []Batch{cancelled, expired} {
		got, err := second.Batch(Team("acme"), want.ID)
		if err != nil || got.Status != want.Status || got.RequestCounts != want.RequestCounts || *got.ErrorFileID != *want.ErrorFileID {
			t.Errorf("after the restart %+v (%v), want %+v", got, err, want)
		}
	}
	if sched.made() != made {
		t.Errorf("%d calls made after the restart", sched.made()-made)
	}
}
