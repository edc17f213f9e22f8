package webhook

import (
	"container/heap"
	"slices"
	"time"

	"inferd/store"
)

// backlog is the Deliverer's view of its outbox: the messages not ended,
// by team, each waiting for its next attempt or being sent. Run owns it.
//
// It keeps the two budgets of webhook delivery. Senders are shared fairly
// by team: a team has at most sendersPerTeam attempts in flight, so a
// receiver that never answers ties up its own team's senders only, and a
// free sender goes to the team with the fewest in flight. Pending messages
// are capped per team: over maxPendingPerTeam, the team's oldest waiting
// message is dropped (trim).
type backlog struct {
	teams   map[string]*teamBacklog
	held    map[string]bool // the ids of every message held, waiting or in flight
	sending int             // attempts in flight, all teams together
}

// teamBacklog is one team's part of the backlog.
type teamBacklog struct {
	waiting dueQueue // messages waiting for their next attempt, soonest first
	sending int      // the team's attempts in flight
}

func newBacklog() *backlog {
	return &backlog{teams: map[string]*teamBacklog{}, held: map[string]bool{}}
}

func (b *backlog) team(id string) *teamBacklog {
	t := b.teams[id]
	if t == nil {
		t = &teamBacklog{}
		b.teams[id] = t
	}
	return t
}

// add holds a message queued in the outbox, unless it is held already (a
// store may tell of one message twice).
func (b *backlog) add(dl store.Delivery) {
	if b.held[dl.ID] {
		return
	}
	b.held[dl.ID] = true
	heap.Push(&b.team(dl.TeamID).waiting, dl)
}

// next takes the message to send now, if a sender is free for one: among
// the teams below their share with a message due, the team with the fewest
// attempts in flight (then the one whose message has been due longest),
// and that team's message due first.
func (b *backlog) next(now time.Time, senders, perTeam int) (store.Delivery, bool) {
	if b.sending >= senders {
		return store.Delivery{}, false
	}
	var best *teamBacklog
	for _, t := range b.teams {
		if t.sending >= perTeam || len(t.waiting) == 0 || t.waiting[0].NextAttempt.After(now) {
			continue
		}
		if best == nil || t.sending < best.sending || t.sending == best.sending && t.waiting.less(t.waiting[0], best.waiting[0]) {
			best = t
		}
	}
	if best == nil {
		return store.Delivery{}, false
	}
	dl := heap.Pop(&best.waiting).(store.Delivery)
	best.sending++
	b.sending++
	return dl, true
}

// wake returns when the next message becomes due that a sender could take
// then, or the zero time if none: a result, which frees a sender, or a new
// message wakes Run first.
func (b *backlog) wake(senders, perTeam int) time.Time {
	var at time.Time
	if b.sending >= senders {
		return at
	}
	for _, t := range b.teams {
		if t.sending < perTeam && len(t.waiting) > 0 && (at.IsZero() || t.waiting[0].NextAttempt.Before(at)) {
			at = t.waiting[0].NextAttempt
		}
	}
	return at
}

// sent ends an attempt of dl: the message waits for its next attempt
// (retry), or it has ended and is no longer held.
func (b *backlog) sent(dl store.Delivery, retry bool) {
	t := b.team(dl.TeamID)
	t.sending--
	b.sending--
	if retry {
		heap.Push(&t.waiting, dl)
		return
	}
	delete(b.held, dl.ID)
	b.forget(dl.TeamID)
}

// trim drops the messages over the pending cap: while a team holds more
// than max (in flight included), its oldest waiting message (the one
// queued first, so the one closest to being given up anyway) is no longer
// held. It returns the dropped messages, to be ended in the store. A
// team's messages in flight are never dropped: they end with their
// attempt.
func (b *backlog) trim(max int) []store.Delivery {
	var dropped []store.Delivery
	for id, t := range b.teams {
		for len(t.waiting)+t.sending > max && len(t.waiting) > 0 {
			oldest := 0
			for i, dl := range t.waiting {
				if older(dl, t.waiting[oldest]) {
					oldest = i
				}
			}
			dl := heap.Remove(&t.waiting, oldest).(store.Delivery)
			delete(b.held, dl.ID)
			dropped = append(dropped, dl)
		}
		b.forget(id)
	}
	return dropped
}

// forget removes a team that holds nothing.
func (b *backlog) forget(team string) {
	if t := b.teams[team]; t != nil && t.sending == 0 && len(t.waiting) == 0 {
		delete(b.teams, team)
	}
}

// teamCount is what a team holds of the backlog.
type teamCount struct {
	pending int64 // messages held, waiting or in flight
	sending int64 // attempts in flight
}

// counts returns what each team holds.
func (b *backlog) counts() map[string]teamCount {
	out := make(map[string]teamCount, len(b.teams))
	for id, t := range b.teams {
		out[id] = teamCount{pending: int64(len(t.waiting) + t.sending), sending: int64(t.sending)}
	}
	return out
}

// older orders messages by when they were queued (then by id, for a
// stable order).
func older(a, b store.Delivery) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.ID < b.ID
}

// dueQueue is a min-heap of messages by next attempt, then by age: within
// a team, messages are sent in the order they fall due.
type dueQueue []store.Delivery

func (q dueQueue) less(a, b store.Delivery) bool {
	if !a.NextAttempt.Equal(b.NextAttempt) {
		return a.NextAttempt.Before(b.NextAttempt)
	}
	return older(a, b)
}

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q.less(q[i], q[j]) }
func (q dueQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *dueQueue) Push(x any)        { *q = append(*q, x.(store.Delivery)) }
func (q *dueQueue) Pop() any {
	old := *q
	dl := old[len(old)-1]
	*q = slices.Delete(old, len(old)-1, len(old))
	return dl
}
