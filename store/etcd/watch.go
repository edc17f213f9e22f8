package etcd

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// projectWatch tells this store's OnProjectChange hooks of the project
// writes other stores (other nodes) commit, so a node's scheduler follows a
// project changed through another node. The store's own writes notify the
// hooks themselves, right after their commit; the watch skips them by
// their revision, so each change is told once.
//
// Own writes hold mu from before their commit until their revision is in
// own, and the watch takes mu before it looks: an event of an own write is
// never judged before its revision is known.
type projectWatch struct {
	mu  sync.Mutex
	own map[int64]bool // revisions of this store's project commits not yet seen by the watch

	cancel   context.CancelFunc
	finished chan struct{}
}

// committed records rev as an own project commit. Callers hold mu.
func (w *projectWatch) committed(rev int64) { w.own[rev] = true }

// start watches the projects from revision from on, until stop.
func (w *projectWatch) start(s *Store, from int64) {
	w.own = map[int64]bool{}
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	w.cancel, w.finished = cancel, make(chan struct{})
	go w.run(ctx, s, from)
}

func (w *projectWatch) stop() {
	w.cancel()
	<-w.finished
}

func (w *projectWatch) run(ctx context.Context, s *Store, from int64) {
	defer close(w.finished)
	dir := s.key("projects") + "/"
	for ctx.Err() == nil {
		for resp := range s.cli.Watch(ctx, dir, clientv3.WithPrefix(), clientv3.WithRev(from)) {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				rev := ev.Kv.ModRevision
				w.mu.Lock()
				mine := w.own[rev]
				delete(w.own, rev)
				w.mu.Unlock()
				if mine {
					continue
				}
				if ev.Type == mvccpb.PUT || ev.Type == mvccpb.DELETE {
					s.hooks.Notify(strings.TrimPrefix(string(ev.Kv.Key), dir))
				}
			}
			from = resp.Header.Revision + 1
		}
		if ctx.Err() != nil {
			return
		}
		// The watch broke (etcd lost its leader, or the revision was
		// compacted away): whatever changed meanwhile is unknown, so every
		// project is told, and the watch goes on from now.
		from = w.resync(ctx, s, dir)
	}
}

// resync notifies the hooks of every project and returns the revision to
// watch from; on failure it returns after ctx ends or tries again.
func (w *projectWatch) resync(ctx context.Context, s *Store, dir string) int64 {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, s.reqTO)
		resp, err := s.cli.Get(rctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			select { // a pause between tries, not a synchronization
			case <-time.After(s.reqTO / 5):
			case <-ctx.Done():
			}
			continue
		}
		for _, kv := range resp.Kvs {
			s.hooks.Notify(strings.TrimPrefix(string(kv.Key), dir))
		}
		from := resp.Header.Revision + 1
		w.mu.Lock()
		for rev := range w.own {
			if rev < from { // their events are before the new watch
				delete(w.own, rev)
			}
		}
		w.mu.Unlock()
		return from
	}
	return 0
}
