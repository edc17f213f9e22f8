package bolt

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// Check reads the data file at path below the store's API, for fault tests
// that look at what a killed daemon left: bbolt's own consistency check of
// its pages, and the call indexes of schema.go (a final call is in
// callfinished and callexpiry and not in callpending, any other call the
// reverse; no pending entry lacks its record; every payload chunk belongs to
// a call, numbered from 0 without gaps). It opens the file read-only
// and returns every stored call and each problem found; err is set only when
// the file cannot be read at all. Run it on a file no daemon holds: it waits
// up to timeout for the lock.
func Check(path string, timeout time.Duration) (calls map[string]store.Call, problems []error, err error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: timeout})
	if err != nil {
		return nil, nil, fmt.Errorf("check data file %s: %w", path, err)
	}
	defer db.Close()
	calls = map[string]store.Call{}
	err = db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			problems = append(problems, fmt.Errorf("bbolt consistency check: %w", err))
		}
		pending := tx.Bucket(bucketCallPending)
		finished := tx.Bucket(bucketCallFinished)
		expiry := tx.Bucket(bucketCallExpiry)
		if err := tx.Bucket(bucketCalls).ForEach(func(k, v []byte) error {
			var c store.Call
			if err := json.Unmarshal(v, &c); err != nil {
				return fmt.Errorf("call %s: %w", k, err)
			}
			readPayloads(tx, k, &c, true, true)
			calls[string(k)] = c
			fin := finished.Get(k)
			switch {
			case c.State.Done() && (pending.Get(k) != nil || fin == nil || expiry.Get(expiryKey(fin, k)) == nil):
				problems = append(problems, fmt.Errorf("finished call %s is missing from the finished/expiry indexes or still pending", k))
			case !c.State.Done() && (pending.Get(k) == nil || fin != nil):
				problems = append(problems, fmt.Errorf("%s call %s is missing from the pending index or marked finished", c.State, k))
			}
			return nil
		}); err != nil {
			return err
		}
		if err := pending.ForEach(func(k, _ []byte) error {
			if _, ok := calls[string(k)]; !ok {
				problems = append(problems, fmt.Errorf("pending index names call %s, which has no record", k))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, name := range [][]byte{bucketCallInputs, bucketCallOutputs} {
			problems = append(problems, checkChunks(tx.Bucket(name), name, calls)...)
		}
		return nil
	})
	if err != nil {
		return nil, problems, fmt.Errorf("check data file %s: %w", path, err)
	}
	return calls, problems, nil
}

// checkChunks checks that every chunk in b (callinputs or calloutputs)
// belongs to a stored call and that each call's chunks are numbered 0, 1, ...
func checkChunks(b *bbolt.Bucket, name []byte, calls map[string]store.Call) []error {
	if b == nil {
		return nil // schema version 1
	}
	var problems []error
	var prev string
	var next uint32
	_ = b.ForEach(func(k, _ []byte) error {
		if len(k) < 4 {
			problems = append(problems, fmt.Errorf("%s: malformed key %x", name, k))
			return nil
		}
		id, n := string(k[:len(k)-4]), binary.BigEndian.Uint32(k[len(k)-4:])
		if id != prev {
			prev, next = id, 0
			if _, ok := calls[id]; !ok {
				problems = append(problems, fmt.Errorf("%s: chunks of call %s, which has no record", name, id))
			}
		}
		if n != next {
			problems = append(problems, fmt.Errorf("%s: call %s has chunk %d where %d was due", name, id, n, next))
		}
		next = n + 1
		return nil
	})
	return problems
}

// TreePages lists the branch and leaf pages the data file at path uses, as
// bbolt classifies them (free pages and overflow continuations left out),
// and the file's page size: for fault tests that damage chosen pages. Run it
// on a file no daemon holds: it waits up to timeout for the lock.
func TreePages(path string, timeout time.Duration) (pages map[string][]int, pageSize int, err error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: timeout})
	if err != nil {
		return nil, 0, fmt.Errorf("list pages of %s: %w", path, err)
	}
	defer db.Close()
	pages = map[string][]int{}
	err = db.View(func(tx *bbolt.Tx) error {
		for id := 2; ; id++ {
			info, err := tx.Page(id)
			if err != nil || info == nil {
				return err
			}
			if info.Type == "branch" || info.Type == "leaf" {
				pages[info.Type] = append(pages[info.Type], id)
				id += info.OverflowCount
			}
		}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("list pages of %s: %w", path, err)
	}
	return pages, db.Info().PageSize, nil
}
