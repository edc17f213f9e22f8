package scheduler

import (
	"context"
	"errors"
	"fmt"

	"inferd/store"
)

// Idempotent starts (Request.IdempotencyKey). A start whose key a call of
// the same team holds, live or stored, admits nothing and is answered with
// that call. The live calls are the loop's (s.idem); the stored ones are
// read from the store, which with etcd may take seconds. That read runs on
// the start's own goroutine, never on the loop (where it would hold up
// every project), while the loop holds the key for it, so that two starts
// with one key never both admit a call:
//
//  1. A start whose key a live call holds is answered with that call.
//  2. Otherwise the loop holds the key (s.keyReads) and sends the start to
//     read the store (startResult.readStore); a start whose key is held
//     already waits behind the one reading.
//  3. The start comes back with what it read (startReq.read): the loop
//     answers it with the stored call, or admits it as a new call, which
//     then holds the key live; then the starts behind it come in again.
//
// Nothing with the key moves from the live index to the store while the
// key is held: a held key has no live call (rule 1 came first), and only
// the held start can admit one. A live call's key leaves s.idem only once
// its final write has committed (onFinal), so a read that begins after
// the key was held finds every call the live index gave up.

// repeated answers a start with an idempotency key as the rules above say,
// and reports whether it did; false admits the start as a new call.
func (s *Scheduler) repeated(req startReq) bool {
	k := string(store.IdempotencyIndexKey(req.c.TeamID, req.c.IdempotencyKey))
	if c, ok := s.idem[k]; ok {
		switch {
		case c.c.RequestHash != req.c.RequestHash:
			req.reply <- startResult{err: ErrIdempotencyMismatch}
		case req.sync:
			req.reply <- startResult{call: c}
		case c.state == callSaving:
			// Its first write is in flight: answer once a write queued
			// behind it has committed, as persist would.
			answer := s.view(c)
			s.st.SaveCallAsync(c.c, func(err error) { req.reply <- persistedResult(answer, err) })
		default:
			s.persist(c, s.view(c), req.reply)
		}
		return true
	}
	if !req.read {
		if behind, held := s.keyReads[k]; held {
			s.keyReads[k] = append(behind, req)
		} else {
			s.keyReads[k] = nil
			req.reply <- startResult{readStore: true}
		}
		return true
	}
	switch got, err := req.stored, req.storeErr; {
	case errors.Is(err, store.ErrNotFound):
		return false
	case err != nil:
		req.reply <- startResult{err: fmt.Errorf("idempotency key: %w", err)}
	case got.RequestHash != req.c.RequestHash:
		req.reply <- startResult{err: ErrIdempotencyMismatch}
	default:
		req.reply <- startResult{c: &got, repeat: true}
	}
	return true
}

// admitBehind lets go of the key a start held for its store read and
// admits the starts that waited behind it, in their order: the first finds
// the call this start made, or holds the key for a read of its own.
func (s *Scheduler) admitBehind(req startReq) {
	k := string(store.IdempotencyIndexKey(req.c.TeamID, req.c.IdempotencyKey))
	behind := s.keyReads[k]
	delete(s.keyReads, k)
	for _, w := range behind {
		s.admit(w)
	}
}

// readKey reads the answer of a keyed start the loop has taken: when the
// loop holds its key for it (readStore), it reads the store here, off the
// loop, and hands the start back with what it read. It returns the channel
// the start's answer comes on.
func (s *Scheduler) readKey(ctx context.Context, req startReq) (chan startResult, error) {
	r := <-req.reply // the loop answers every start it takes
	if !r.readStore {
		req.reply <- r // the answer itself, for start to read as usual
		return req.reply, nil
	}
	req.read, req.reply = true, make(chan startResult, 1)
	req.stored, req.storeErr = s.st.CallByIdempotencyKey(req.c.TeamID, req.c.IdempotencyKey)
	// Back to the loop even when the client is gone: the key is held
	// until this start lets go of it.
	req.gaveUp = ctx.Err() != nil
	select {
	case s.submitc <- req:
	case <-s.stopped:
		return nil, errStopped
	}
	if req.gaveUp {
		return nil, ctx.Err()
	}
	return req.reply, nil
}
