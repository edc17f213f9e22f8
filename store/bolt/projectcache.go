package bolt

import (
	"sync"

	"inferd/store"
)

// projectCache keeps projects found by modelKey, so /start/v4 usually skips
// the read transaction and the JSON decode (a profile of sync starts at
// concurrency 64 showed ProjectByModelKey at 9% of the daemon's CPU). Only
// this process writes the file, so the cache can only go stale through a
// project write, which bumps gen and empties it after its commit. A lookup
// that read the file before that commit sees gen changed and does not cache
// what it read, so a change is seen the moment the write returns (the same
// scheme as keyCache).
type projectCache struct {
	mu     sync.RWMutex
	gen    uint64
	byHash map[string]store.Project // modelKey hash → project
}

func (c *projectCache) get(hash string) (store.Project, uint64, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	p, ok := c.byHash[hash]
	return p.Clone(), c.gen, ok
}

func (c *projectCache) put(hash string, p store.Project, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return
	}
	if c.byHash == nil {
		c.byHash = make(map[string]store.Project)
	}
	c.byHash[hash] = p.Clone()
}

// reset forgets every project; called after each project write, whether or
// not it committed (a failed commit may still have reached the disk).
func (c *projectCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.byHash)
}
