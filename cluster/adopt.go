package cluster

import (
	"context"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// adopt takes the calls the leader hands to this node: it lists
// assign/<name>/ (calls handed over while this node was away or before
// this session), then watches it, and for each key calls Adopt and deletes
// the key. It runs for one session: a node that is fenced adopts nothing
// until its new session (whose OnSession binds the adoptions to the new
// lease).
func (n *Node) adopt(ctx context.Context) {
	dir := n.o.Prefix + AssignPrefix + n.o.Name + "/"
	cli := n.o.Client
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, requestTimeout)
		resp, err := cli.Get(lctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			if waitOr(ctx, nil, n.o.Retry) {
				return
			}
			continue
		}
		for _, kv := range resp.Kvs {
			n.adoptOne(ctx, dir, string(kv.Key))
		}
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range cli.Watch(wctx, dir, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.PUT {
					n.adoptOne(ctx, dir, string(ev.Kv.Key))
				}
			}
		}
		wcancel() // broken or ended: list again (an adopted key is deleted, so none is adopted twice by this loop)
	}
}

// adoptOne hands one call to Adopt and deletes its assign key. Adopt is
// tried again while it fails (etcd not answering), until the session's
// context ends, which keeps the key for the next session. A key whose
// delete fails is adopted again at the next listing: Adopt must take a
// call it already holds as a no-op.
func (n *Node) adoptOne(ctx context.Context, dir, key string) {
	id := strings.TrimPrefix(key, dir)
	for {
		if ctx.Err() != nil {
			return
		}
		err := n.o.Adopt(id)
		if err == nil {
			break
		}
		n.o.Log.Warn().Err(err).Str("call", id).Msg("a call handed to this node could not be read; trying again")
		if waitOr(ctx, nil, n.o.Retry) {
			return
		}
	}
	dctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	if _, err := n.o.Client.Delete(dctx, key); err != nil {
		n.o.Log.Warn().Err(err).Str("call", id).Msg("deleting an adopted call's assign key failed")
	}
}
