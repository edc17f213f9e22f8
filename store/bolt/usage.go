package bolt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// The usage roll-ups (store.Usage) are the bucket usage: one record per
// hour, team and project (usageKey), the sum of what was added to it. A
// call's usage is added by the transaction that applies its first final
// record to the data file (usageRoll, from the log's applier or its replay),
// so the record and its share of the roll-up land together, exactly once.

// usageKey is the usage key of a row: its hour as 8-byte big-endian unix
// seconds (byte order is time order), the team id, NUL, the project id.
func usageKey(k store.UsageKey) []byte {
	b := make([]byte, 8, 8+len(k.TeamID)+1+len(k.ProjectID))
	binary.BigEndian.PutUint64(b, uint64(max(k.Hour.Unix(), 0)))
	b = append(b, k.TeamID...)
	b = append(b, 0)
	return append(b, k.ProjectID...)
}

// hourPrefix is the first 8 bytes of the usage keys of hour t.
func hourPrefix(t time.Time) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, uint64(max(store.UsageHour(t).Unix(), 0)))
	return b
}

// addUsageRow adds r to its stored row, in tx.
func addUsageRow(tx *bbolt.Tx, r store.UsageRow) error {
	b := tx.Bucket(bucketUsage)
	k := usageKey(r.Key())
	sum := store.UsageRow{Hour: store.UsageHour(r.Hour), TeamID: r.TeamID, ProjectID: r.ProjectID}
	if v := b.Get(k); v != nil {
		if err := json.Unmarshal(v, &sum); err != nil {
			return fmt.Errorf("usage row %s/%s/%s: %w", sum.Hour.Format(time.RFC3339), r.TeamID, r.ProjectID, err)
		}
	}
	sum.Add(r)
	v, err := json.Marshal(sum)
	if err != nil {
		return err
	}
	b.FillPercent = appendFill // keys grow with time, as the call buckets'
	return b.Put(k, v)
}

// finalUsage is what a final call record says of its usage: only these
// fields are decoded.
type finalUsage struct {
	State     store.CallState  `json:"state"`
	ProjectID string           `json:"projectId"`
	TeamID    string           `json:"teamId"`
	Finished  time.Time        `json:"finished"`
	QueueMs   int64            `json:"queueMs"`
	BootMs    int64            `json:"bootMs"`
	RunMs     int64            `json:"runMs"`
	Usage     *store.CallUsage `json:"usage"`
}

// usageField is how a record that carries usage spells it.
var usageField = []byte(`"usage":`)

// usageRoll sums the usage of one transaction's final call writes, so that
// a group commit writes each hour's row once, however many calls it holds.
// The zero value is ready; a nil *usageRoll writes each call's at once.
type usageRoll struct{ rows []store.UsageRow }

// addCall adds the usage of a call's final write, unless an earlier final
// write of the call did (wasFinal). A record without usage adds nothing.
func (r *usageRoll) addCall(tx *bbolt.Tx, cw *callWrite, wasFinal bool) error {
	if wasFinal {
		return nil
	}
	row, ok := cw.usageRow()
	switch {
	case !ok:
		return nil
	case r == nil:
		return addUsageRow(tx, row)
	}
	// Summed as they come while the rows are few (a batch's calls share a
	// handful of hours, teams and projects): the batch's hundreds of calls
	// then grow no slice of a row each. Past foldRows, rows are appended
	// and write sums them.
	k := row.Key()
	if len(r.rows) <= foldRows {
		for i := range r.rows {
			if r.rows[i].Key().Compare(k) == 0 {
				r.rows[i].Add(row)
				return nil
			}
		}
		sum := store.UsageRow{Hour: k.Hour, TeamID: k.TeamID, ProjectID: k.ProjectID}
		sum.Add(row)
		row = sum
	}
	r.rows = append(r.rows, row)
	return nil
}

// foldRows is how many rows addCall looks through for the key of a new
// one before it appends unsummed (write sums them all anyway).
const foldRows = 32

// write adds the rows summed to the stored ones, in tx.
func (r *usageRoll) write(tx *bbolt.Tx) error {
	for _, row := range store.SumUsage(r.rows) {
		if err := addUsageRow(tx, row); err != nil {
			return err
		}
	}
	return nil
}

// usageRow is what cw adds to the roll-up: the row worked out when it was
// queued, or for a write that has none (decoded from a log), the one its
// record holds.
func (cw *callWrite) usageRow() (store.UsageRow, bool) {
	if cw.usage != nil {
		return *cw.usage, true
	}
	return recordUsage(cw.value)
}

// recordUsage reads the usage a final call record holds.
func recordUsage(record []byte) (store.UsageRow, bool) {
	if !bytes.Contains(record, usageField) {
		return store.UsageRow{}, false
	}
	var f finalUsage
	if err := json.Unmarshal(record, &f); err != nil {
		return store.UsageRow{}, false // a record the call's own decode would refuse too
	}
	return store.CallUsageRow(store.Call{State: f.State, ProjectID: f.ProjectID, TeamID: f.TeamID,
		Finished: f.Finished, QueueMs: f.QueueMs, BootMs: f.BootMs, RunMs: f.RunMs, Usage: f.Usage})
}

// AddUsage adds rows to the roll-ups in one transaction.
func (s *Store) AddUsage(rows []store.UsageRow) error {
	for _, r := range rows {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	err := s.update(func(tx *bbolt.Tx) error {
		for _, r := range store.SumUsage(rows) {
			if err := addUsageRow(tx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("add usage: %w", err)
	}
	return nil
}

// UsageRows returns the rows of teamID ("" = all) with hours in [from, to),
// sorted by hour, team, project.
func (s *Store) UsageRows(teamID string, from, to time.Time) ([]store.UsageRow, error) {
	out := []store.UsageRow{}
	if !from.Before(to) {
		return out, nil
	}
	start, end := hourPrefix(from), to.UTC()
	s.pend.flush() // the roll-up of calls written a moment ago is in the data file
	err := s.view(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketUsage)
		if b == nil {
			return nil // a file of an older schema, opened read-only
		}
		c := b.Cursor()
		for k, v := c.Seek(start); k != nil; k, v = c.Next() {
			var r store.UsageRow
			if err := json.Unmarshal(v, &r); err != nil {
				return corruptError(s.path, fmt.Errorf("usage row %q: %w", k, err))
			}
			if !r.Hour.Before(end) {
				return nil
			}
			if r.Hour.Before(from) || (teamID != "" && r.TeamID != teamID) {
				continue
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("usage rows: %w", err)
	}
	return out, nil
}

// ExpireUsage deletes the rows of hours before `before`, in transactions of
// at most expireChunk rows.
func (s *Store) ExpireUsage(before time.Time) (int, error) {
	limit := uint64(max(before.Unix(), 0))
	total := 0
	for {
		var keys [][]byte
		err := s.update(func(tx *bbolt.Tx) error {
			b := tx.Bucket(bucketUsage)
			c := b.Cursor()
			for k, _ := c.First(); k != nil && len(keys) < expireChunk; k, _ = c.Next() {
				if len(k) < 8 || binary.BigEndian.Uint64(k[:8]) >= limit {
					break
				}
				keys = append(keys, bytes.Clone(k))
			}
			for _, k := range keys {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("expire usage: %w", err)
		}
		total += len(keys)
		if len(keys) < expireChunk {
			return total, nil
		}
	}
}
