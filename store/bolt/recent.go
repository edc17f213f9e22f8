package bolt

import (
	"encoding/json"
	"fmt"
	"sync"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// RecentScanLimit bounds the call records one RecentCalls examines, so that
// a team with few calls among many of other teams' never holds a read
// transaction for long.
const RecentScanLimit = 5000

// RecentCalls returns up to limit calls of teamID ("" = every team), newest
// first, without their inputs and outputs: what a status page may show. It
// looks at no more than the RecentScanLimit newest calls.
func (s *Store) RecentCalls(teamID string, limit int) ([]store.Call, error) {
	calls := make([]store.Call, 0, min(max(limit, 0), 64))
	if limit <= 0 {
		return calls, nil
	}
	s.pend.flush() // a call written a moment ago is listed
	err := s.view(func(tx *bbolt.Tx) error {
		cur := tx.Bucket(bucketCalls).Cursor()
		// Call ids are UUIDv7: the last key is the newest call.
		scanned := 0
		for k, v := cur.Last(); k != nil && len(calls) < limit && scanned < RecentScanLimit; k, v = cur.Prev() {
			scanned++
			c, ok := s.summaries.get(k)
			if !ok {
				var sum callSummary
				if err := json.Unmarshal(v, &sum); err != nil {
					return fmt.Errorf("decode call %s: %w", k, err)
				}
				c = sum.Call
				s.summaries.put(k, c)
			}
			if teamID == "" || c.TeamID == teamID {
				calls = append(calls, c)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("recent calls: %w", err)
	}
	return calls, nil
}

// callSummary decodes a Call record but skips its inputs and outputs, which
// may be large and must not leave the store here: the outer fields shadow
// the embedded ones and discard what they are given.
type callSummary struct {
	store.Call
	Inputs  discard `json:"inputs"`
	Outputs discard `json:"outputs"`
	Webhook discard `json:"webhook"` // may carry a token in its query
}

// discard is a JSON value that is checked for syntax and then dropped.
type discard struct{}

func (*discard) UnmarshalJSON([]byte) error { return nil }

// summaryCacheMax bounds the summaries kept: twice what one RecentCalls
// scans, so that a status page polling every few seconds decodes only the
// calls finished since its last poll.
const summaryCacheMax = 2 * RecentScanLimit

// summaryCache keeps the summaries of finished calls, keyed by call id. A
// status poll decodes up to RecentScanLimit records, and decoding scans the
// inputs and outputs too, however large (500 calls of 100 KB took 0.6 s a
// poll). A finished call's record is final: the only later write to it is
// its expiry, after which the scan no longer meets its key, so an entry
// never goes stale. Running and queued calls are not kept.
type summaryCache struct {
	mu sync.Mutex
	m  map[string]store.Call
}

func (c *summaryCache) get(id []byte) (store.Call, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call, ok := c.m[string(id)]
	return call, ok
}

// put keeps call if it has finished; a full cache starts again empty.
func (c *summaryCache) put(id []byte, call store.Call) {
	if !call.State.Done() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= summaryCacheMax {
		c.m = make(map[string]store.Call, 256)
	}
	c.m[string(id)] = call
}
