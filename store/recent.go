package store

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// RecentScanLimit bounds the call records one RecentCalls examines, so that
// a team with few calls among many of other teams' never holds a read
// transaction for long.
const RecentScanLimit = 5000

// RecentCalls returns up to limit calls of teamID ("" = every team), newest
// first, without their inputs and outputs: what a status page may show. It
// looks at no more than the RecentScanLimit newest calls.
func (s *Store) RecentCalls(teamID string, limit int) ([]Call, error) {
	calls := make([]Call, 0, min(max(limit, 0), 64))
	if limit <= 0 {
		return calls, nil
	}
	err := s.view(func(tx *bolt.Tx) error {
		cur := tx.Bucket(bucketCalls).Cursor()
		// Call ids are UUIDv7: the last key is the newest call.
		scanned := 0
		for k, v := cur.Last(); k != nil && len(calls) < limit && scanned < RecentScanLimit; k, v = cur.Prev() {
			scanned++
			var c callSummary
			if err := json.Unmarshal(v, &c); err != nil {
				return fmt.Errorf("decode call %s: %w", k, err)
			}
			if teamID == "" || c.TeamID == teamID {
				calls = append(calls, c.Call)
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
	Call
	Inputs  discard `json:"inputs"`
	Outputs discard `json:"outputs"`
}

// discard is a JSON value that is checked for syntax and then dropped.
type discard struct{}

func (*discard) UnmarshalJSON([]byte) error { return nil }
