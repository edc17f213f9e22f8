package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"inferd/store"
	"inferd/store/etcd"
)

// campaign stands for leader with the session's lease until ctx ends (the
// session ended, or shutdown), leading whenever elected. Leadership ends
// with the session at once: ctx is cancelled when the session's lease
// lapses, and every leader write is fenced on the election key anyway
// (for about 0.6 s after a cut two nodes may both believe they lead).
func (n *Node) campaign(ctx context.Context, sess *concurrency.Session) {
	dir := n.o.Prefix + ElectionPrefix
	for ctx.Err() == nil {
		key, rev, err := n.stand(ctx, sess, dir)
		if err != nil {
			if ctx.Err() == nil {
				n.o.Log.Warn().Err(err).Str("node", n.o.Name).Msg("standing for cluster leader failed; trying again")
				waitOr(ctx, nil, n.o.Retry)
			}
			continue
		}
		e := concurrency.ResumeElection(sess, dir, key, rev)
		f := etcd.Fence{Key: e.Key(), Rev: e.Rev()}
		n.setLeading(&f)
		n.o.Log.Info().Str("node", n.o.Name).Int64("rev", f.Rev).Msg("this node leads the cluster")
		err = n.lead(ctx, f)
		n.setLeading(nil)
		if deposed := ctx.Err() == nil; deposed {
			// Deposed while the session lives: resign, or this node's
			// key would block the next election until its lease lapsed;
			// bounded, as etcd may be gone. When the session ends the
			// key goes with its lease (revoked at shutdown, lapsed when
			// cut off): nothing to wait for.
			rctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			if rerr := e.Resign(rctx); rerr != nil && err == nil {
				err = rerr
			}
			cancel()
		}
		if err != nil && ctx.Err() == nil {
			n.o.Log.Warn().Err(err).Str("node", n.o.Name).Msg("this node stopped leading the cluster")
		}
	}
}

// stand is concurrency.Election.Campaign without its clean-up: it puts
// this session's candidate key (create-if-absent, under the lease) and
// waits until no older candidate is left; it returns the key and its
// create revision. Campaign resigns through the client's own context when
// its context ends, which hangs while etcd is unreachable (a node cut
// off, or shutting down without etcd); here nothing is to clean up: the
// key goes with the lease (revoked at shutdown, lapsed when cut off).
func (n *Node) stand(ctx context.Context, sess *concurrency.Session, dir string) (string, int64, error) {
	cli := n.o.Client
	key := fmt.Sprintf("%s%x", dir, sess.Lease())
	pctx, cancel := context.WithTimeout(ctx, requestTimeout)
	resp, err := cli.Txn(pctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, n.o.Name, clientv3.WithLease(sess.Lease()))).
		Else(clientv3.OpGet(key)).Commit()
	cancel()
	if err != nil {
		return "", 0, fmt.Errorf("put candidate key: %w", err)
	}
	rev := resp.Header.Revision
	if !resp.Succeeded { // this session stood before (a pass that failed later)
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return "", 0, errors.New("put candidate key: neither put nor found")
		}
		rev = kvs[0].CreateRevision
	}
	// Wait for every older candidate's key to go, newest first (as
	// concurrency's waitDeletes does).
	for {
		opts := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))
		gctx, cancel := context.WithTimeout(ctx, requestTimeout)
		older, err := cli.Get(gctx, dir, opts...)
		cancel()
		if err != nil {
			return "", 0, fmt.Errorf("read older candidates: %w", err)
		}
		if len(older.Kvs) == 0 {
			return key, rev, nil
		}
		if err := waitDeleted(ctx, cli, string(older.Kvs[0].Key), older.Header.Revision); err != nil {
			return "", 0, err
		}
	}
}

// waitDeleted waits until key is deleted after revision rev, or ctx ends.
func waitDeleted(ctx context.Context, cli *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range cli.Watch(wctx, key, clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch older candidate: %w", err)
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("watch older candidate: ended")
}

func (n *Node) setLeading(f *etcd.Fence) {
	n.mu.Lock()
	n.leading = f
	n.mu.Unlock()
}

// lead does the leader's work until ctx ends or a write finds it deposed
// (etcd.ErrNotLeader): look at once, then on every change of the nodes or
// the projects, and every RecheckEvery (loads change without a node
// joining or leaving: scale-out).
func (n *Node) lead(ctx context.Context, f etcd.Fence) error {
	t := time.NewTicker(n.o.RecheckEvery)
	defer t.Stop()
	var scanned time.Time // the last full scan of the pending calls' nodes
	for {
		// A full scan at the start of a leadership (nodes lost while there
		// was none) and now and then; otherwise the nodes the watch saw go.
		full := scanned.IsZero() || time.Since(scanned) >= fullScanEvery*n.o.RecheckEvery
		err := n.reconcile(ctx, f, full)
		switch {
		case errors.Is(err, etcd.ErrNotLeader):
			return err
		case err != nil:
			n.o.Log.Warn().Err(err).Str("node", n.o.Name).Msg("cluster leader's pass failed; trying again")
		case full:
			scanned = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-n.kick:
		case <-t.C:
		}
	}
}

// reconcile is one pass of the leader: placements first (a lost node's
// calls go to the nodes its projects are now placed on), then lost nodes.
func (n *Node) reconcile(ctx context.Context, f etcd.Fence, full bool) error {
	if !n.nodes.isSynced() || !n.placements.isSynced() {
		return nil // the caches are not in yet: every node would look dead
	}
	projects, err := n.o.Store.ListProjects("")
	if err != nil {
		return fmt.Errorf("list projects: %w", err)
	}
	if err := n.placeAll(ctx, f, projects); err != nil {
		return err
	}
	// A failed pass over the quotas leaves the shares as they are (each
	// within the quota) and does not hold up the lost nodes' calls.
	err = n.shareQuotas(ctx, f)
	if errors.Is(err, etcd.ErrNotLeader) {
		return err
	}
	if lerr := n.handleLost(ctx, f, projects, full); lerr != nil {
		return lerr
	}
	return err
}

// placeAll writes every project's placement that changed, and deletes
// those of deleted projects.
func (n *Node) placeAll(ctx context.Context, f etcd.Fence, projects []store.Project) error {
	nodes := n.Nodes()
	if len(nodes) == 0 {
		return nil
	}
	cur := map[string]Placement{}
	for name := range n.placements.all() {
		if p, ok := n.Placement(name); ok {
			cur[name] = p
		}
	}
	now := n.o.Now().UTC()
	want := place(projects, nodes, cur, now)
	for id, shares := range want {
		if maps.Equal(shares, cur[id].Nodes) {
			continue
		}
		p := Placement{Project: id, Nodes: shares, Joined: joined(cur[id], shares, now), Leader: n.o.Name, Updated: now}
		v, err := json.Marshal(p)
		if err != nil {
			return fmt.Errorf("encode placement of %s: %w", id, err)
		}
		if err := n.fenced(ctx, f, clientv3.OpPut(n.o.Prefix+PlacementPrefix+id, string(v))); err != nil {
			return fmt.Errorf("place project %s: %w", id, err)
		}
		n.o.Log.Info().Str("project", id).Any("nodes", shares).Msg("cluster placement changed")
	}
	// A deleted project's placement goes; so does one that no live node
	// can take now (its nodes died): a start then waits for a placement
	// rather than being sent to a dead node.
	for id := range cur {
		if _, placed := want[id]; !placed {
			if err := n.fenced(ctx, f, clientv3.OpDelete(n.o.Prefix+PlacementPrefix+id)); err != nil {
				return fmt.Errorf("drop placement of project %s: %w", id, err)
			}
		}
	}
	return nil
}

// joined is when each node of shares entered the placement: as in cur
// for a node that was in it, now for one that was not.
func joined(cur Placement, shares map[string]Share, now time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	for n := range shares {
		t, known := cur.Joined[n]
		_, was := cur.Nodes[n]
		switch {
		case was && known:
			out[n] = t
		case !was:
			out[n] = now
		}
	}
	return out
}

// fenced commits ops if f still holds: etcd.ErrNotLeader otherwise. ctx
// ending (the session over) ends it at once.
func (n *Node) fenced(ctx context.Context, f etcd.Fence, ops ...clientv3.Op) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := n.o.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev)).
		Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	if !resp.Succeeded {
		return etcd.ErrNotLeader
	}
	return nil
}

// handleLost moves the calls of every node that pending calls name and
// that is not alive (docs/cluster.md, "Lost node"), and of a node that
// vanished and came back (fenced and rejoined) those it held before it
// vanished: it abandoned them when fenced. Unless full, it looks only at
// the nodes whose key the watch saw vanish; full also reads which nodes
// pending calls name (all of the pending index).
func (n *Node) handleLost(ctx context.Context, f etcd.Fence, projects []store.Project, full bool) error {
	var names []string
	if full {
		all, err := n.o.Store.NodesWithCalls()
		if err != nil {
			return fmt.Errorf("nodes with calls: %w", err)
		}
		for _, name := range all {
			if _, cached := n.nodes.get(name); !cached {
				names = append(names, name) // dead, or the cache is behind: alive reads etcd
			}
		}
	}
	n.mu.Lock()
	lostAt := maps.Clone(n.lostAt)
	n.mu.Unlock()
	for name := range lostAt {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	byID := map[string]store.Project{}
	for _, p := range projects {
		byID[p.ID] = p
	}
	for _, name := range names {
		now, alive, readAt, err := n.alive(ctx, name)
		if err != nil {
			return err
		}
		gone, vanished := lostAt[name]
		// A node alive again is left alone unless the same process is
		// back (fenced and rejoined): a restarted one recovers its calls
		// itself (PendingCalls), and a fenced one abandoned those it held
		// before its key vanished.
		rejoined := vanished && !gone.started.IsZero() && now.Started.Equal(gone.started)
		if alive && !rejoined {
			n.forget(name, gone)
			continue
		}
		before := gone.rev
		if !alive {
			// Every call it holds, but none it might write if it came
			// back right after this read.
			before = readAt + 1
		}
		if err := n.handOverNode(f, name, before, byID); err != nil {
			return err
		}
		if !alive {
			if _, err := n.o.Store.HandOverDeliveries(f, name, n.o.Name); err != nil {
				return fmt.Errorf("hand over the webhooks of lost node %s: %w", name, err)
			}
			if err := n.fenced(ctx, f, clientv3.OpDelete(n.o.Prefix+AssignPrefix+name+"/", clientv3.WithPrefix())); err != nil {
				return fmt.Errorf("drop the assign keys of lost node %s: %w", name, err)
			}
		}
		n.forget(name, gone)
	}
	return nil
}

// forget drops a lost node's entry once handled, unless it vanished again
// meanwhile.
func (n *Node) forget(name string, handled lost) {
	n.mu.Lock()
	if n.lostAt[name] == handled {
		delete(n.lostAt, name)
	}
	n.mu.Unlock()
}

// alive reads node name's key now, and the revision it read at: a
// linearizable read, so a node the cache has not heard of yet is never
// taken for dead.
func (n *Node) alive(ctx context.Context, name string) (NodeInfo, bool, int64, error) {
	if name == n.o.Name {
		return NodeInfo{Name: name, Started: n.started}, true, 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := n.o.Client.Get(ctx, n.o.Prefix+NodesPrefix+name)
	if err != nil {
		return NodeInfo{}, false, 0, fmt.Errorf("is node %s alive: etcd: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return NodeInfo{}, false, resp.Header.Revision, nil
	}
	var info NodeInfo
	_ = json.Unmarshal(resp.Kvs[0].Value, &info) // undecodable: alive, of unknown start
	return info, true, resp.Header.Revision, nil
}

// handOverNode moves the calls of lost node name written before revision
// before: a queued call to a live node its
// project is placed on; a running one likewise as a retry when its
// project's retries allow (the attempt it was in stays counted: the new
// node's dispatch counts the next), else it fails with "node NAME was
// lost". A call changed since read is left for the next pass.
func (n *Node) handOverNode(f etcd.Fence, name string, before int64, projects map[string]store.Project) error {
	calls, err := n.o.Store.CallsOfNode(name)
	if err != nil {
		return fmt.Errorf("calls of lost node %s: %w", name, err)
	}
	msg := fmt.Sprintf("error: node %s was lost", name)
	moved, failed := 0, 0
	for _, ca := range calls {
		if ca.Rev >= before {
			continue // written after it came back: its own
		}
		c := ca.Call
		p, known := projects[c.ProjectID]
		again := known && (c.State == store.CallQueued ||
			c.State == store.CallRunning && p.Retries > 0 && c.Attempt <= p.Retries)
		to := ""
		if again {
			to = n.target(c.ProjectID, name)
		}
		if to != "" {
			if c.State == store.CallRunning {
				// Its queue deadline is behind it: it was dispatched in
				// time (as the scheduler's restart recovery does).
				c.QueueTimeout = 0
			}
			err = n.o.Store.HandOver(f, c, ca.Rev, to)
			moved++
		} else if again {
			continue // no live node at all now: the next pass
		} else {
			err = n.o.Store.FailLost(f, c, ca.Rev, msg)
			failed++
		}
		switch {
		case errors.Is(err, etcd.ErrNotLeader):
			return err
		case errors.Is(err, etcd.ErrCallChanged):
			n.o.Log.Info().Err(err).Str("call", c.ID).Msg("lost node's call changed meanwhile; reading it again next pass")
			n.wake()
		case err != nil:
			return err
		}
	}
	if moved+failed > 0 {
		n.o.Log.Warn().Str("lost", name).Int("handedOver", moved).Int("failed", failed).Msg("calls of a lost cluster node moved")
	}
	return nil
}

// target is the live node a lost call of project goes to: the placed node
// with the fewest calls of it (then by name); with none placed alive, the
// live node with the fewest calls in all; "" with no live node but lost.
func (n *Node) target(project, lost string) string {
	nodes := n.Nodes()
	p, _ := n.Placement(project)
	load := func(info NodeInfo, only string) int {
		sum := 0
		for id, l := range info.Projects {
			if only == "" || id == only {
				sum += l.Busy + l.Queued
			}
		}
		return sum
	}
	pick := func(ok func(NodeInfo) bool, only string) string {
		best, bestLoad := "", 0
		for _, info := range nodes { // by name
			if info.Name == lost || !ok(info) {
				continue
			}
			if l := load(info, only); best == "" || l < bestLoad {
				best, bestLoad = info.Name, l
			}
		}
		return best
	}
	if to := pick(func(i NodeInfo) bool { _, placed := p.Nodes[i.Name]; return placed }, project); to != "" {
		return to
	}
	return pick(func(NodeInfo) bool { return true }, "")
}

// leadingFence returns this node's fence while it leads; ok is false
// when it does not lead.
func (n *Node) leadingFence() (etcd.Fence, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.leading == nil {
		return etcd.Fence{}, false
	}
	return *n.leading, true
}
