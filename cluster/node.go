package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"inferd/store"
	"inferd/store/etcd"
)

// requestTimeout bounds each etcd request of the node's own (the store's
// requests have the store's bound).
const requestTimeout = 5 * time.Second

// leaveTimeout bounds revoking the node's lease at shutdown: a healthy
// etcd answers in milliseconds; one without quorum (or cut off) never
// does, and the lease then lapses by itself within its TTL, the node's
// key and candidacy with it, so shutdown need not wait longer.
const leaveTimeout = 2 * time.Second

// fullScanEvery is how many RecheckEvery periods apart the leader reads
// the whole pending index for nodes that are gone (a safety net: the
// nodes watch tells it of each node that goes).
const fullScanEvery = 10

// LeaderStore is what the leader reads and writes through the store
// (*etcd.Store): the projects, and the calls of lost nodes.
type LeaderStore interface {
	ListProjects(teamID string) ([]store.Project, error)
	OnProjectChange(fn func(projectID string))
	NodesWithCalls() ([]string, error)
	CallsOfNode(node string) ([]etcd.CallAt, error)
	HandOver(f etcd.Fence, c store.Call, rev int64, to string) error
	FailLost(f etcd.Fence, c store.Call, rev int64, msg string) error
	HandOverDeliveries(f etcd.Fence, from, to string) (int, error)
	// The teams, whose quotas the leader leases to nodes (quota.go).
	ListTeams() ([]store.Team, error)
}

// Options configure New.
type Options struct {
	// Client and Prefix are the store's ((*etcd.Store).Client, Prefix):
	// the node's keys live beside the records.
	Client *clientv3.Client
	Prefix string
	// Name is this node's (cluster.name); Advertise the base URL of its API
	// for the other nodes; Member whether it runs an etcd member.
	Name      string
	Advertise string
	Member    bool
	// Load returns this node's capacity and per-project load now; it is
	// called once per PublishEvery and must not block. Nil: nothing.
	Load func() (Capacity, map[string]ProjectLoad)
	// Teams returns this node's state of each team with a leased quota
	// (quota.go), read with Load; it must not block. Nil: none.
	Teams func() map[string]TeamLoad
	// OnTeamShare is called with a team's id when the leader's lease of
	// its quotas changed, on the watch's goroutine: it must not block.
	OnTeamShare func(team string)
	// OnSession is called with each new session's node key and lease,
	// after the key is put and before the node adopts any call: the store
	// binds its call writes to it (BindLease).
	OnSession func(leaseKey string, lease clientv3.LeaseID)
	// OnFenced is called when the session ended without Run's context
	// ending (the lease lapsed: the node was cut off): every live call
	// must be abandoned, unwritten. A new session follows.
	OnFenced func()
	// Adopt is called with each call the leader handed to this node
	// (assign/<name>/<id>), once per assign key, from one goroutine. An
	// error says the call could not be read now (etcd not answering): it
	// is tried again, and its key kept until it is taken.
	Adopt func(callID string) error
	// OnPlacement is called with a project's id when its placement
	// changed (or was deleted), on the watch's goroutine: it must not
	// block.
	OnPlacement func(project string)
	// Store is what the leader works through.
	Store LeaderStore
	Log   zerolog.Logger
	// Now stamps NodeInfo and Placement times; nil means time.Now.
	Now func() time.Time
	// TTL is the session's lease; 0 means LeaseTTL. Whole seconds.
	TTL time.Duration
	// PublishEvery is how often Load is read and the node key put again
	// if it changed; 0 means 1 s.
	PublishEvery time.Duration
	// RecheckEvery is how often the leader runs placement and looks for
	// lost nodes without being told of a change; 0 means 3 s.
	RecheckEvery time.Duration
	// Retry is the pause before a failed session or listing is tried
	// again; 0 means 500 ms.
	Retry time.Duration
}

// Node is this inferd's membership in the cluster: its lease and node key,
// its candidacy for leader (and the leader's work while it leads), the
// assign watch, and the caches of nodes, placements and the election that
// the request path reads.
type Node struct {
	o       Options
	started time.Time

	nodes, placements, election, quotas *cache

	live  atomic.Bool
	lease atomic.Int64  // the live session's lease; 0 between sessions
	kick  chan struct{} // the leader should look again (one wake-up is enough)

	// lapsed is the lease of the last session, which lapsed under this
	// node (fenced) and is revoked before it joins again (revokeLapsed);
	// 0 when none. Only Run's goroutine uses it.
	lapsed clientv3.LeaseID

	// shares is each team's quota record as TeamShare decoded it last.
	sharesMu sync.Mutex
	shares   map[string]decoded

	mu      sync.Mutex
	lostAt  map[string]lost // nodes whose key vanished, for the leader
	leading *etcd.Fence     // this node's fence while it leads
}

// The router and the payload store read the cluster through the Node.
var (
	_ View  = (*Node)(nil)
	_ Peers = (*Node)(nil)
)

// New returns the node; Run makes it a member.
func New(o Options) (*Node, error) {
	switch {
	case o.Client == nil:
		return nil, errors.New("cluster node: no etcd client")
	case o.Name == "":
		return nil, errors.New("cluster node: no name")
	case o.Store == nil:
		return nil, errors.New("cluster node: no store")
	}
	if !strings.HasSuffix(o.Prefix, "/") {
		o.Prefix += "/"
	}
	if o.Load == nil {
		o.Load = func() (Capacity, map[string]ProjectLoad) { return Capacity{}, nil }
	}
	if o.OnFenced == nil {
		o.OnFenced = func() {}
	}
	if o.OnSession == nil {
		o.OnSession = func(string, clientv3.LeaseID) {}
	}
	if o.Adopt == nil {
		o.Adopt = func(string) error { return nil }
	}
	if o.OnPlacement == nil {
		o.OnPlacement = func(string) {}
	}
	if o.OnTeamShare == nil {
		o.OnTeamShare = func(string) {}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.TTL = cmp.Or(o.TTL, LeaseTTL)
	o.PublishEvery = cmp.Or(o.PublishEvery, time.Second)
	o.RecheckEvery = cmp.Or(o.RecheckEvery, 3*time.Second)
	o.Retry = cmp.Or(o.Retry, 500*time.Millisecond)
	n := &Node{o: o, started: o.Now().UTC(), kick: make(chan struct{}, 1), lostAt: map[string]lost{}}
	n.nodes = newCache(o.Prefix+NodesPrefix, n.nodeChanged)
	n.placements = newCache(o.Prefix+PlacementPrefix, func(c change) { o.OnPlacement(c.name) })
	n.election = newCache(o.Prefix+ElectionPrefix, nil)
	n.quotas = newCache(o.Prefix+QuotaPrefix, func(c change) { o.OnTeamShare(c.name) })
	o.Store.OnProjectChange(func(string) { n.wake() })
	return n, nil
}

// Name is this node's name.
func (n *Node) Name() string { return n.o.Name }

// Live reports whether the node holds a live lease now (its key is put and
// its session not ended).
func (n *Node) Live() bool { return n.live.Load() }

// Nodes returns the live nodes as the watch cache holds them, by name.
func (n *Node) Nodes() []NodeInfo {
	var out []NodeInfo
	for name, e := range n.nodes.all() {
		if info, ok := decodeNode(name, e); ok {
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b NodeInfo) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// LiveCount is how many nodes are live (their keys in the watch cache),
// at least 1: cheap enough for every request (a key's rate is split among
// them).
func (n *Node) LiveCount() int { return max(n.nodes.len(), 1) }

// NodeInfo returns one live node as the watch cache holds it.
func (n *Node) NodeInfo(name string) (NodeInfo, bool) {
	e, ok := n.nodes.get(name)
	if !ok {
		return NodeInfo{}, false
	}
	return decodeNode(name, e)
}

// Placement returns a project's placement as the watch cache holds it.
func (n *Node) Placement(project string) (Placement, bool) {
	e, ok := n.placements.get(project)
	if !ok {
		return Placement{}, false
	}
	var p Placement
	if json.Unmarshal(e.value, &p) != nil {
		return Placement{}, false
	}
	return p, true
}

// Leader returns the leader's node name, "" when there is none: the
// candidate whose election key is oldest.
func (n *Node) Leader() string {
	var (
		leader string
		rev    int64
	)
	for _, e := range n.election.all() {
		if rev == 0 || e.createRev < rev {
			leader, rev = string(e.value), e.createRev
		}
	}
	return leader
}

// decodeNode decodes a nodes/ entry; one that does not decode (another
// version's) is left out.
func decodeNode(name string, e entry) (NodeInfo, bool) {
	var info NodeInfo
	if json.Unmarshal(e.value, &info) != nil || info.Name != name {
		return NodeInfo{}, false
	}
	return info, true
}

// lost is a node whose key vanished: at which revision, and the start
// time of the process that held it (to tell a node fenced and back, which
// abandoned its calls, from one restarted, which recovers its own).
type lost struct {
	rev     int64
	started time.Time
}

// nodeChanged is the nodes cache's hook: a node joined or vanished, which
// the leader acts on at once. A node's load changes (its key put again)
// wait for the leader's next recheck: they come up to once a second from
// every node, and a pass reads etcd.
func (n *Node) nodeChanged(c change) {
	if !c.deleted && !c.created {
		// A node that wants more of a team's quota than its share waits
		// for the leader: look at once rather than at the next recheck.
		if e, ok := n.nodes.get(c.name); ok {
			if info, ok := decodeNode(c.name, e); ok && wantsMoreShare(info) {
				n.wake()
			}
		}
		return
	}
	if c.deleted {
		var info NodeInfo
		_ = json.Unmarshal(c.prev, &info) // unknown: a zero start, taken as restarted
		n.mu.Lock()
		n.lostAt[c.name] = lost{rev: c.rev, started: info.Started}
		n.mu.Unlock()
	}
	n.wake()
}

func (n *Node) wake() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// Run keeps the node a member until ctx ends: a session (lease), the node
// key under it, the assign watch, the candidacy for leader. When the
// session ends under it (the node was cut off longer than the TTL), the
// node is fenced (OnFenced) and starts a new session. On the way out it
// revokes its lease (within leaveTimeout), so its key and its candidacy
// vanish at once and the next leader is elected without waiting out the
// TTL.
func (n *Node) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wctx, stop := context.WithCancel(ctx)
	defer func() {
		stop()
		wg.Wait()
	}()
	for _, c := range []*cache{n.nodes, n.placements, n.election, n.quotas} {
		wg.Go(func() { c.run(wctx, n.o.Client, n.o.Retry) })
	}
	failing := false // told once per outage, not at every try
	for ctx.Err() == nil {
		err := n.session(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil && !failing:
			n.o.Log.Error().Err(err).Str("node", n.o.Name).Msg("cluster session failed; trying again until etcd answers")
			failing = true
		case err != nil:
			n.o.Log.Debug().Err(err).Str("node", n.o.Name).Msg("cluster session failed again")
		}
		if err != nil && ctx.Err() == nil {
			waitOr(ctx, nil, n.o.Retry) // a pause between tries, not a synchronization
		} else {
			failing = false
		}
	}
	return nil
}

// session runs one session: until it ends (fenced) or ctx ends (shut
// down: revoked).
func (n *Node) session(ctx context.Context) error {
	cli := n.o.Client
	if err := n.revokeLapsed(ctx); err != nil {
		return err
	}
	// The session's own context: the revoke at shutdown must outlive ctx.
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	gctx, gcancel := context.WithTimeout(ctx, requestTimeout)
	grant, err := cli.Grant(gctx, int64(max(n.o.TTL/time.Second, 1)))
	gcancel()
	if err != nil {
		return fmt.Errorf("grant lease: %w", err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithLease(grant.ID), concurrency.WithContext(sctx),
		concurrency.WithTTL(int(max(n.o.TTL/time.Second, 1))))
	if err != nil {
		return fmt.Errorf("keep lease alive: %w", err)
	}
	key := n.o.Prefix + NodesPrefix + n.o.Name
	pub := &publisher{n: n, key: key, lease: sess.Lease()}
	for {
		if err := pub.publish(ctx); err == nil {
			break
		} else if ctx.Err() != nil || waitOr(ctx, sess.Done(), n.o.Retry) {
			// Never joined: no call was bound to this lease, so there is
			// nothing to fence (and the daemon's OnFenced waits for a
			// scheduler that starts once a session has joined).
			if ctx.Err() != nil {
				n.endSession(sess, false)
			} else {
				sess.Orphan()
			}
			return fmt.Errorf("put node key: %w", err)
		}
	}
	n.lease.Store(int64(sess.Lease()))
	n.o.OnSession(key, sess.Lease())
	n.live.Store(true)
	n.o.Log.Info().Str("node", n.o.Name).Int64("lease", int64(sess.Lease())).Msg("cluster node joined")

	pctx, pcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { pub.run(pctx) })
	wg.Go(func() { n.adopt(pctx) })
	wg.Go(func() { n.campaign(pctx, sess) })
	fenced := false
	select {
	case <-sess.Done():
		fenced = ctx.Err() == nil
	case <-ctx.Done():
	}
	n.live.Store(false)
	n.lease.Store(0)
	pcancel()
	// At once, before waiting for this session's goroutines: one may be
	// inside an etcd request that lasts while etcd does not answer (the
	// leader's store reads). What they write after a revoke is refused:
	// the node key and the election key went with the lease.
	n.endSession(sess, fenced)
	wg.Wait()
	return nil
}

// endSession ends a session: a lapsed one is told to OnFenced; one ended
// by shutdown revokes its lease (within leaveTimeout), so its key and
// candidacy vanish at once.
func (n *Node) endSession(sess *concurrency.Session, fenced bool) {
	if fenced {
		n.o.Log.Warn().Str("node", n.o.Name).Int64("lease", int64(sess.Lease())).
			Msg("cluster lease lapsed: this node is fenced, its calls abandoned; rejoining")
		n.o.OnFenced()
		sess.Orphan()
		n.lapsed = sess.Lease()
		return
	}
	sess.Orphan() // its keep-alive ends
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if _, err := n.o.Client.Revoke(ctx, sess.Lease()); err != nil {
		n.o.Log.Warn().Err(err).Str("node", n.o.Name).Msg("revoking the cluster lease failed; it lapses by itself")
	}
}

// revokeLapsed revokes the lease of the session that lapsed under this
// node (fenced), if any, before it joins again, so that its node key
// visibly vanishes first: the leader hands over the calls a fenced node
// abandoned only when it sees that key go (handleLost: those written
// before it vanished). etcd ends a lease only while it has a leader, and
// a new raft leader extends every lease: after the whole cluster lost
// quorum, every node's old lease is still there once quorum returns, and
// a put of the node key under the new lease would move the key to it, so
// the old lease's end would delete nothing and the calls the node
// abandoned would stay pending on it for good. A lease that lapsed at
// etcd already (its key deleted then) is not found: nothing to do.
func (n *Node) revokeLapsed(ctx context.Context) error {
	if n.lapsed == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if _, err := n.o.Client.Revoke(rctx, n.lapsed); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke the lapsed lease %x: %w", int64(n.lapsed), err)
	}
	n.lapsed = 0
	return nil
}

// waitOr waits d, and reports true if ctx ended or done closed first.
func waitOr(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return false
	case <-done:
		return true
	case <-ctx.Done():
		return true
	}
}

// publisher puts the node key under the session's lease, again whenever
// what it says changed (at most once per PublishEvery).
type publisher struct {
	n     *Node
	key   string
	lease clientv3.LeaseID
	last  string // the last value put, Updated left out
}

func (p *publisher) run(ctx context.Context) {
	t := time.NewTicker(p.n.o.PublishEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil {
			return // both were ready: the select may have picked the tick
		}
		if err := p.publish(ctx); err != nil {
			p.n.o.Log.Warn().Err(err).Str("node", p.n.o.Name).Msg("publishing this node's capacity failed")
		}
	}
}

// publish puts the node key if what it says changed since the last put;
// ctx ending (the session over) ends the put.
func (p *publisher) publish(ctx context.Context) error {
	capa, loads := p.n.o.Load()
	info := NodeInfo{Name: p.n.o.Name, Advertise: p.n.o.Advertise, Lease: int64(p.lease), Started: p.n.started,
		Member: p.n.o.Member, Capacity: capa, Projects: loads}
	if p.n.o.Teams != nil {
		info.Teams = p.n.o.Teams()
	}
	same, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("encode node info: %w", err)
	}
	if string(same) == p.last {
		return nil
	}
	info.Updated = p.n.o.Now().UTC()
	v, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("encode node info: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if _, err := p.n.o.Client.Put(ctx, p.key, string(v), clientv3.WithLease(p.lease)); err != nil {
		return fmt.Errorf("put %s: %w", p.key, err)
	}
	p.last = string(same)
	return nil
}
