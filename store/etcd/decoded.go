package etcd

import (
	"bytes"
	"sync"
)

// decodedCache keeps, for each record a hot read decodes (every start
// reads its key and its project: LookupStart), the bytes it last decoded and
// what they decoded to. A read that finds the same bytes takes the decoded
// value: comparing a record's bytes costs a small part of decoding its
// JSON, and needs no reasoning about revisions. It holds at most
// decodedCacheMax records and starts afresh past that, so records deleted
// since do not pile up.
type decodedCache[T any] struct {
	mu sync.Mutex
	m  map[string]decodedRecord[T]
}

type decodedRecord[T any] struct {
	raw []byte
	v   T
}

const decodedCacheMax = 1024

// decode returns raw, the value of record key, decoded as decode does.
// The value is shared with later reads of the same bytes: a caller that
// hands it on copies what it may change.
func (c *decodedCache[T]) decode(what, key string, raw []byte) (T, error) {
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if ok && bytes.Equal(e.raw, raw) {
		return e.v, nil
	}
	v, err := decode[T](what, key, raw)
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= decodedCacheMax {
		c.m = make(map[string]decodedRecord[T])
	}
	c.m[key] = decodedRecord[T]{raw: bytes.Clone(raw), v: v}
	c.mu.Unlock()
	return v, nil
}
