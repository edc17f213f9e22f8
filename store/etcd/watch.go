package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// keyWatch tells this store's change hooks of the writes other stores
// (other nodes) commit under one directory, so a node's scheduler follows a
// project or a team quota changed through another node. The store's own
// writes run the hooks themselves, right after their commit; the watch
// skips them by their revision, so each change is told once.
//
// Own writes hold mu from before their commit until their revision is in
// own, and the watch takes mu before it looks: an event of an own write is
// never judged before its revision is known.
type keyWatch struct {
	dir    string                   // full key prefix, ending in "/"
	tell   func(ev *clientv3.Event) // runs the hooks for another node's change
	resync func(id string)          // runs the hooks for an id after a broken watch

	mu  sync.Mutex
	own map[int64]bool // revisions of this store's commits not yet seen by the watch

	watchRun
}

// watchRun is the life of one watch goroutine, owned by the Store: start
// in Open, stop in Close. Its context requires an etcd leader, so a member
// cut off from the others breaks the watch instead of going quiet.
type watchRun struct {
	cancel   context.CancelFunc
	finished chan struct{}
}

func (r *watchRun) start(run func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	r.cancel, r.finished = cancel, make(chan struct{})
	go func() {
		defer close(r.finished)
		run(ctx)
	}()
}

func (r *watchRun) stop() {
	r.cancel()
	<-r.finished
}

// pause waits d, or less when ctx ends first: a pause between tries of a
// watch or a read, so that an unreachable etcd is not hammered; never a
// synchronization.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// committed records rev as an own commit. Callers hold mu.
func (w *keyWatch) committed(rev int64) { w.own[rev] = true }

// start watches dir from revision from on, until stop.
func (w *keyWatch) start(s *Store, from int64) {
	w.own = map[int64]bool{}
	w.watchRun.start(func(ctx context.Context) { w.run(ctx, s, from) })
}

func (w *keyWatch) run(ctx context.Context, s *Store, from int64) {
	for ctx.Err() == nil {
		for resp := range s.cli.Watch(ctx, w.dir, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV()) {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				rev := ev.Kv.ModRevision
				w.mu.Lock()
				mine := w.own[rev]
				delete(w.own, rev)
				w.mu.Unlock()
				if !mine {
					w.tell(ev)
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		// The watch broke (etcd lost its leader, or the revision was
		// compacted away): whatever changed meanwhile is unknown, so every
		// record is told, and the watch goes on from now.
		from = w.resyncAll(ctx, s)
	}
}

// resyncAll runs resync for every id under dir and returns the revision to
// watch from; it tries until ctx ends.
func (w *keyWatch) resyncAll(ctx context.Context, s *Store) int64 {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, s.reqTO)
		resp, err := s.cli.Get(rctx, w.dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			pause(ctx, s.reqTO/5)
			continue
		}
		for _, kv := range resp.Kvs {
			w.resync(strings.TrimPrefix(string(kv.Key), w.dir))
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

// startWatches watches projects and teams from revision from.
func (s *Store) startWatches(from int64) {
	s.projectWatch = keyWatch{
		dir:    s.key("projects") + "/",
		resync: s.hooks.Notify,
		tell: func(ev *clientv3.Event) {
			s.hooks.Notify(strings.TrimPrefix(string(ev.Kv.Key), s.key("projects")+"/"))
		},
	}
	s.teamWatch = keyWatch{
		dir:    s.key("teams") + "/",
		resync: s.teamHooks.NotifyTeam,
		tell: func(ev *clientv3.Event) {
			// Teams are created implicitly (by keys and projects) with no
			// quota: only a quota change is news.
			if ev.Type != mvccpb.PUT || ev.PrevKv != nil && bytes.Equal(ev.PrevKv.Value, ev.Kv.Value) {
				return
			}
			var prev, cur store.Team
			if ev.PrevKv != nil {
				_ = json.Unmarshal(ev.PrevKv.Value, &prev) // undecodable: told, as a change
			}
			if err := json.Unmarshal(ev.Kv.Value, &cur); err == nil && prev.Quota == cur.Quota {
				return
			}
			s.teamHooks.NotifyTeam(strings.TrimPrefix(string(ev.Kv.Key), s.key("teams")+"/"))
		},
	}
	s.projectWatch.start(s, from)
	s.teamWatch.start(s, from)
	s.watchHandedDeliveries(from)
}
