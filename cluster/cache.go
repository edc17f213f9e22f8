package cluster

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// entry is one key of a watched directory as the cache holds it.
type entry struct {
	value     []byte
	createRev int64
	modRev    int64
	lease     int64
}

// change is one event a cache tells its owner of: the key's name under the
// directory, whether it was deleted, and the revision of the change (for a
// delete, the revision at which the key vanished).
type change struct {
	name    string
	deleted bool
	created bool // a key that was not there before
	rev     int64
	prev    []byte // a deleted key's last value, when the cache held it
}

// cache mirrors one directory (nodes/, placement/, election/, quota/) in memory,
// kept by an etcd watch, so the request path reads it without an etcd
// round trip. Its run goroutine is owned by Node.Run.
type cache struct {
	dir string // full prefix, ending in "/"

	mu      sync.RWMutex
	entries map[string]entry
	synced  bool // the first listing is in

	// tell hears of each change after the cache applied it; it must not
	// block (the owner's kick channels).
	tell func(change)
}

func newCache(dir string, tell func(change)) *cache {
	if tell == nil {
		tell = func(change) {}
	}
	return &cache{dir: dir, entries: map[string]entry{}, tell: tell}
}

// run lists the directory and follows it until ctx ends. A broken watch
// (etcd lost its leader, or the revision was compacted) lists again: the
// cache keeps its last state meanwhile, as the best this node knows.
func (c *cache) run(ctx context.Context, cli *clientv3.Client, retry time.Duration) {
	for ctx.Err() == nil {
		rev, ok := c.list(ctx, cli)
		if !ok {
			select { // a pause between tries while etcd does not answer, not a synchronization
			case <-time.After(retry):
			case <-ctx.Done():
			}
			continue
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range cli.Watch(wctx, c.dir, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				c.apply(ev)
			}
		}
		cancel()
	}
}

// list replaces the cache with the directory as it is now and tells of
// every difference; it returns the revision it read at.
func (c *cache) list(ctx context.Context, cli *clientv3.Client) (int64, bool) {
	lctx, cancel := context.WithTimeout(ctx, LeaseTTL)
	resp, err := cli.Get(lctx, c.dir, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return 0, false
	}
	fresh := map[string]entry{}
	for _, kv := range resp.Kvs {
		fresh[strings.TrimPrefix(string(kv.Key), c.dir)] = entry{kv.Value, kv.CreateRevision, kv.ModRevision, kv.Lease}
	}
	rev := resp.Header.Revision
	var told []change
	c.mu.Lock()
	for name, e := range fresh {
		old, ok := c.entries[name]
		if ok && old.createRev != e.createRev {
			// Deleted and created again while the watch was broken (a
			// node fenced and back): told as vanished, at the new key's
			// creation, which is after every write under the old key's
			// lease and before any under the new one's.
			told = append(told, change{name: name, deleted: true, rev: e.createRev, prev: old.value})
		}
		if !ok || string(old.value) != string(e.value) || old.createRev != e.createRev {
			told = append(told, change{name: name, rev: rev, created: !ok || old.createRev != e.createRev})
		}
	}
	for name, old := range c.entries {
		if _, ok := fresh[name]; !ok {
			told = append(told, change{name: name, deleted: true, rev: rev, prev: old.value})
		}
	}
	c.entries, c.synced = fresh, true
	c.mu.Unlock()
	for _, ch := range told {
		c.tell(ch)
	}
	return rev, true
}

func (c *cache) apply(ev *clientv3.Event) {
	name := strings.TrimPrefix(string(ev.Kv.Key), c.dir)
	ch := change{name: name, rev: ev.Kv.ModRevision}
	c.mu.Lock()
	if ev.Type == mvccpb.DELETE {
		ch.deleted, ch.prev = true, c.entries[name].value
		delete(c.entries, name)
	} else {
		ch.created = ev.IsCreate()
		c.entries[name] = entry{ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision, ev.Kv.Lease}
	}
	c.mu.Unlock()
	c.tell(ch)
}

// get returns one entry.
func (c *cache) get(name string) (entry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.entries[name]
	return e, ok
}

// all returns a copy of every entry, by name.
func (c *cache) all() map[string]entry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]entry, len(c.entries))
	for k, v := range c.entries {
		out[k] = v
	}
	return out
}

// len is how many entries the cache holds.
func (c *cache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}

// isSynced reports whether the first listing is in.
func (c *cache) isSynced() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.synced
}
