package scheduler

import "fmt"

// callState is where a live call is in its life, as the loop tracks it. The
// store's states (queued, running, succeeded, failed) are what clients see;
// the loop adds the two moments when a write is in flight that the call must
// not get ahead of, because a callID returned is never lost and a result read
// is never lost:
//
//   - saving: the call's first write (its admission write) is in flight. The
//     call is not dispatched, and its ID is not handed out, until it commits.
//   - finishing: the outcome is decided and the final write is in flight.
//     Lookup keeps showing the call as it was, and waiters are not woken,
//     until it commits.
//
// booting is not a state of the call but of its project: view shows a queued
// call as booting while its project boots a replica.
//
// Every call is born queued, either from an admission or recovered from the
// store at start-up, and every move goes through call.to, which allows only
// the moves in transitions.
type callState uint8

const (
	callQueued    callState = iota // in its project's queue, dispatchable
	callSaving                     // in its project's queue, its first write in flight: not dispatchable
	callRunning                    // on a replica
	callFinishing                  // outcome decided, final write in flight
	callSucceeded                  // final write committed: waiters woken
	callFailed                     // final write committed, or failed (then kept in memory): waiters woken
	callDropped                    // its first write failed: the start got the error; nobody knows the ID
	callAbandoned                  // cluster mode: dropped without a write, the call handed to another node (cluster.go)
)

var callStateNames = [...]string{
	callQueued:    "queued",
	callSaving:    "saving",
	callRunning:   "running",
	callFinishing: "finishing",
	callSucceeded: "succeeded",
	callFailed:    "failed",
	callDropped:   "dropped",
	callAbandoned: "abandoned",
}

func (s callState) String() string {
	if int(s) < len(callStateNames) {
		return callStateNames[s]
	}
	return fmt.Sprintf("callState(%d)", s)
}

// transitions lists every move a call may make, and only those. Call control
// (control.go) adds no move of its own: a cancel, a purge and a queue expiry
// are queued/saving → finishing and running → finishing with a failed
// outcome, as a project deletion is; a retry is running → queued, the move a
// call dispatched to a replica that had just died makes too (a retry keeps
// its attempt counted, a call that never reached the model does not).
var transitions = map[callState][]callState{
	// A sync start's wait ended with the call still queued (its first write),
	// or an async start's call was just admitted; dispatched; or ended while
	// waiting (cancel, purge, queueTimeout, project gone).
	//
	// In cluster mode any live call may be abandoned (Abandon, or a write
	// fenced: the call is another node's now), its final write's answer
	// included.
	callQueued: {callSaving, callRunning, callFinishing, callAbandoned},
	// First write committed: dispatchable; failed: dropped. The project may
	// fail its queue meanwhile (deleted, boot failures, too few GPUs).
	callSaving: {callQueued, callDropped, callFinishing, callAbandoned},
	// Never reached the model (the replica had exited), or interrupted with
	// retries left: back to the queue. Otherwise the model answered, failed,
	// timed out, the replica went, or the call was cancelled.
	callRunning: {callQueued, callFinishing, callAbandoned},
	// The final write committed, or failed: then the call is failed.
	callFinishing: {callSucceeded, callFailed, callAbandoned},
}

// allowed reports whether a call may move from one state to the other.
func allowed(from, to callState) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// to moves c to next, or leaves it where it is and returns an error when the
// lifecycle does not allow that move (a bug in the loop, never a client's
// doing).
func (c *call) to(next callState) error {
	if !allowed(c.state, next) {
		return fmt.Errorf("call %s: %s → %s is not an allowed move", c.c.ID, c.state, next)
	}
	c.state = next
	return nil
}

// finished reports whether the call's outcome is decided.
func (c *call) finished() bool { return c.state >= callFinishing }
