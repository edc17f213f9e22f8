package scheduler

import "time"

// Clock is the scheduler's source of time. Every timing rule (boot, inference
// and idle timeouts, restart backoff) goes through it so that tests can drive
// time by hand.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it did.
	Stop() bool
}

// RealClock returns the Clock of the time package.
func RealClock() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// timer is one loop-owned timer slot (a replica's boot timer, a call's
// inference timer...). A fired timer reaches the loop as an event carrying the
// seq it was armed with; the loop ignores it unless the slot still holds that
// seq, because Stop cannot recall a callback that has already started.
type timer struct {
	t   Timer
	seq uint64
	at  time.Time // when it fires; zero when not armed
}

// armed reports whether the slot holds a pending timer.
func (tm *timer) armed() bool { return tm.seq != 0 }

// fired reports whether an event with seq is this slot's current timer, and
// if so clears the slot.
func (tm *timer) fired(seq uint64) bool {
	if tm.seq == 0 || tm.seq != seq {
		return false
	}
	*tm = timer{}
	return true
}

// stop disarms the slot.
func (tm *timer) stop() {
	if tm.t != nil {
		tm.t.Stop()
	}
	*tm = timer{}
}
