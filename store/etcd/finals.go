package etcd

import (
	"context"
	"errors"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// finalWatch tells the OnCallFinal hooks of every call made final through
// any node: one etcd watch per store on the finished/ index, where every
// final write of a call puts finished/<unix nanos>/<id> (callOps). A long
// poll on one node for a call that runs on another waits on it (the
// scheduler's waiters, fed through OnCallFinal).
//
// The watch starts in Open from the revision Open read at, so no final
// write committed after Open is missed, whenever a hook is registered. A
// watch that breaks (etcd lost its leader, the connection was cut) goes on
// from the revision after the last one it saw; one whose revision was
// compacted away meanwhile lists the whole index instead, telling every
// id in it (a hook is told of a call at least once, maybe more often).
type finalWatch struct {
	store.CallHooks
	watchRun
}

// OnCallFinal registers fn to run with the id of each call that becomes
// final, through this node or any other (its final write committed). Hooks
// run on the store's watch goroutine, in registration order: they must be
// quick and must not wait on the store. A call may be told more than once
// (a final call written again, a watch that lost its history), and a hook
// registered late is not told of calls made final before.
func (s *Store) OnCallFinal(fn func(id string)) { s.finals.OnCallFinal(fn) }

// start watches the finished/ index from revision from on, until stop.
func (w *finalWatch) start(s *Store, from int64) {
	w.watchRun.start(func(ctx context.Context) { w.run(ctx, s, from) })
}

func (w *finalWatch) run(ctx context.Context, s *Store, from int64) {
	dir := s.key("finished") + "/"
	for ctx.Err() == nil {
		var err error
		for resp := range s.cli.Watch(ctx, dir, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithFilterDelete()) {
			if err = resp.Err(); err != nil {
				break
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.PUT { // deletes (expiry) are filtered out by etcd already
					w.NotifyFinal(finishedID(string(ev.Kv.Key)))
				}
				// Not the header's revision: a watch catching up sends
				// the current revision with only part of the events.
				from = ev.Kv.ModRevision + 1
			}
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, rpctypes.ErrCompacted) {
			// What changed between from and now is gone from etcd's
			// history: every final call is told again.
			from = w.relist(ctx, s, dir)
			continue
		}
		// etcd lost its leader or this node its connection: go on from
		// where the watch stood, after a pause.
		pause(ctx, s.reqTO/5)
	}
}

// relist tells every id in the finished/ index and returns the revision to
// watch from; it tries until ctx ends.
func (w *finalWatch) relist(ctx context.Context, s *Store, dir string) int64 {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 4*s.reqTO)
		resp, err := s.cli.Get(rctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			pause(ctx, s.reqTO/5)
			continue
		}
		for _, kv := range resp.Kvs {
			w.NotifyFinal(finishedID(string(kv.Key)))
		}
		return resp.Header.Revision + 1
	}
	return 0
}

// finishedID is the call id of a finished/<unix nanos>/<id> key.
func finishedID(key string) string { return key[strings.LastIndexByte(key, '/')+1:] }
