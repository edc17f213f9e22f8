package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/internal/testenv"
	"inferd/store"
	"inferd/store/etcd"
)

// within is how long a test waits for the cluster to get where it should:
// a new leader, a handover, a placement (a few seconds in practice).
const within = 15 * time.Second

// startMember runs a one-member etcd for the test with test raft timing.
func startMember(t *testing.T) *etcd.Member {
	t.Helper()
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return "http://" + ln.Addr().String()
	}
	m, err := etcd.StartMember(etcd.MemberConfig{Name: "test", DataDir: t.TempDir(), PeerURL: free(), ClientURL: free(),
		HeartbeatMs: 10, ElectionMs: 100, StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// testNode is one node of a test cluster: its own store (and so its own
// etcd client), its Node, and what its hooks heard.
type testNode struct {
	st      *etcd.Store
	n       *Node
	stop    context.CancelFunc
	done    chan struct{}
	adopted chan string
	fenced  chan struct{}

	mu          sync.Mutex
	load        func() (Capacity, map[string]ProjectLoad)
	teams       func(n *Node) map[string]TeamLoad // nil: none
	adoptFails  int                               // Adopt fails this many more times, as with etcd not answering
	adoptsTried int
}

func (tn *testNode) setLoad(fn func() (Capacity, map[string]ProjectLoad)) {
	tn.mu.Lock()
	tn.load = fn
	tn.mu.Unlock()
}

// kill stops the node as a shutdown does (resign, revoke) and waits.
func (tn *testNode) kill() {
	tn.stop()
	<-tn.done
}

// startNode starts node name over m, its capacity a CPU slots.
func startNode(t *testing.T, m *etcd.Member, name string, cpuSlots int) *testNode {
	t.Helper()
	return startNodeOn(t, m.ClientURLs()[0], name, cpuSlots, 0)
}

// startNodeAt starts node name (2 CPU slots) with etcd at endpoint and a
// session TTL of its own.
func startNodeAt(t *testing.T, endpoint, name string, ttl time.Duration) *testNode {
	t.Helper()
	return startNodeOn(t, endpoint, name, 2, ttl)
}

func startNodeOn(t *testing.T, endpoint, name string, cpuSlots int, ttl time.Duration) *testNode {
	t.Helper()
	st, err := etcd.Open(etcd.Options{Endpoints: []string{endpoint}, Node: name, Prefix: "/test/", RequestTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{st: st, done: make(chan struct{}), adopted: make(chan string, 64), fenced: make(chan struct{}, 8)}
	tn.load = func() (Capacity, map[string]ProjectLoad) { return Capacity{CPUSlots: cpuSlots}, nil }
	n, err := New(Options{
		Client: st.Client(), Prefix: st.Prefix(), Name: name, Advertise: "http://" + name, Store: st,
		Load: func() (Capacity, map[string]ProjectLoad) {
			tn.mu.Lock()
			defer tn.mu.Unlock()
			return tn.load()
		},
		Teams: func() map[string]TeamLoad {
			tn.mu.Lock()
			defer tn.mu.Unlock()
			if tn.teams == nil {
				return nil
			}
			return tn.teams(tn.n)
		},
		Adopt: func(id string) error {
			tn.mu.Lock()
			tn.adoptsTried++
			if tn.adoptFails > 0 {
				tn.adoptFails--
				tn.mu.Unlock()
				return store.ErrUnavailable
			}
			tn.mu.Unlock()
			tn.adopted <- id
			return nil
		},
		OnFenced:     func() { tn.fenced <- struct{}{} },
		Log:          zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		PublishEvery: 20 * time.Millisecond, RecheckEvery: 100 * time.Millisecond, Retry: 50 * time.Millisecond, TTL: ttl,
	})
	if err != nil {
		t.Fatal(err)
	}
	tn.n = n
	ctx, cancel := context.WithCancel(context.Background())
	tn.stop = cancel
	go func() {
		defer close(tn.done)
		if err := n.Run(ctx); err != nil {
			t.Errorf("node %s Run: %v", name, err)
		}
	}()
	t.Cleanup(func() {
		tn.kill()
		st.Close()
	})
	return tn
}

// waitFor is the shared poller (internal/testenv).
var waitFor = testenv.WaitFor

// leaders returns the nodes that lead now, by their own account.
func leaders(nodes ...*testNode) []string {
	var out []string
	for _, tn := range nodes {
		if _, ok := tn.n.leadingFence(); ok {
			out = append(out, tn.n.Name())
		}
	}
	return out
}

// agreedLeader waits until every node is live, sees all the others, and
// all name the one leader that leads; it returns it.
func agreedLeader(t *testing.T, nodes ...*testNode) *testNode {
	t.Helper()
	var leader *testNode
	waitFor(t, "one leader that every node names", func() bool {
		ls := leaders(nodes...)
		if len(ls) != 1 {
			return false
		}
		for _, tn := range nodes {
			if !tn.n.Live() || len(tn.n.Nodes()) != len(nodes) || tn.n.Leader() != ls[0] {
				return false
			}
			if tn.n.Name() == ls[0] {
				leader = tn
			}
		}
		return true
	})
	return leader
}

func TestThreeNodesElectOneLeaderAndSeeEachOther(t *testing.T) {
	m := startMember(t)
	a, b, c := startNode(t, m, "a", 2), startNode(t, m, "b", 2), startNode(t, m, "c", 2)
	leader := agreedLeader(t, a, b, c)
	defer func() {
		// A leader shut down resigns and revokes its lease: its key goes
		// and another leads at once, well before the lease's TTL.
		start := time.Now()
		leader.kill()
		var rest []*testNode
		for _, tn := range []*testNode{a, b, c} {
			if tn != leader {
				rest = append(rest, tn)
			}
		}
		agreedLeader(t, rest...)
		if d := time.Since(start); d >= LeaseTTL/2 {
			t.Errorf("after the leader shut down a new one took %s", d)
		}
	}()
	info, ok := b.n.NodeInfo("c")
	if !ok || info.Advertise != "http://c" || info.Capacity.CPUSlots != 2 || info.Lease == 0 {
		t.Errorf("b's NodeInfo(c) = %+v, %v", info, ok)
	}
	if got := a.n.Nodes(); len(got) != 3 || got[0].Name != "a" || got[2].Name != "c" {
		t.Errorf("a's Nodes() = %+v, want a, b, c by name", got)
	}
	// A change of capacity is published (at most once per PublishEvery).
	c.setLoad(func() (Capacity, map[string]ProjectLoad) {
		return Capacity{CPUSlots: 2, CPUUsed: 1}, map[string]ProjectLoad{"p": {Replicas: 1, Busy: 1}}
	})
	waitFor(t, "a sees c's new load", func() bool {
		info, ok := a.n.NodeInfo("c")
		return ok && info.Capacity.CPUUsed == 1 && info.Projects["p"].Busy == 1
	})
}

// The leader's session ends (its lease revoked, as etcd does when a node
// is cut off past the TTL): another node leads within a few seconds, the
// old leader is fenced and rejoins, and a write under the old leader's
// fence is refused.
func TestLeaderWhoseLeaseEndsIsReplacedAndFenced(t *testing.T) {
	m := startMember(t)
	a, b, c := startNode(t, m, "a", 2), startNode(t, m, "b", 2), startNode(t, m, "c", 2)
	all := []*testNode{a, b, c}
	old := agreedLeader(t, all...)
	oldFence, _ := old.n.leadingFence()
	info, _ := old.n.NodeInfo(old.n.Name())
	start := time.Now()
	if _, err := old.st.Client().Revoke(context.Background(), clientv3.LeaseID(info.Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-old.fenced:
	case <-time.After(within):
		t.Fatal("the old leader was not fenced")
	}
	waitFor(t, "another node leads", func() bool {
		ls := leaders(all...)
		return len(ls) == 1 && ls[0] != old.n.Name()
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the new leader took %s", d)
	}
	// The old leader's writes are refused: placement and call moves.
	if err := old.n.fenced(context.Background(), oldFence, clientv3.OpPut(old.st.Prefix()+PlacementPrefix+"x", "{}")); !errors.Is(err, etcd.ErrNotLeader) {
		t.Errorf("a placement write under the old fence = %v, want ErrNotLeader", err)
	}
	lostCall := store.Call{ID: "call_x", ProjectID: "p", TeamID: "acme", State: store.CallRunning}
	if err := old.st.FailLost(oldFence, lostCall, 0, "error: node x was lost"); !errors.Is(err, etcd.ErrNotLeader) {
		t.Errorf("a call write under the old fence = %v, want ErrNotLeader", err)
	}
	if _, err := old.st.GetCall("call_x"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the refused write left call_x: %v", err)
	}
	// It rejoins with a new lease, and all agree on the new leader.
	waitFor(t, "the old leader rejoins", func() bool {
		i, ok := b.n.NodeInfo(old.n.Name())
		return ok && i.Lease != info.Lease && old.n.Live()
	})
	if again := agreedLeader(t, all...); again == old {
		t.Errorf("the fenced node leads again")
	}
}

// putProject creates p through st and waits until leader placed it.
func putProject(t *testing.T, st *etcd.Store, p store.Project) {
	t.Helper()
	if _, err := st.PutProject(p); err != nil {
		t.Fatal(err)
	}
}

// A GPU project is placed only on the node with a free (simulated) GPU,
// every node's cache shows it, and the hook hears of it.
func TestGPUProjectIsPlacedOnTheNodeWithAFreeGPU(t *testing.T) {
	m := startMember(t)
	a, b, c := startNode(t, m, "a", 4), startNode(t, m, "b", 4), startNode(t, m, "c", 4)
	b.setLoad(func() (Capacity, map[string]ProjectLoad) {
		return Capacity{CPUSlots: 4, GPUs: []GPUInfo{gpu(0, 24000, 24000, false)}}, nil
	})
	c.setLoad(func() (Capacity, map[string]ProjectLoad) {
		return Capacity{CPUSlots: 4, GPUs: []GPUInfo{gpu(0, 24000, 2000, false)}}, nil
	})
	agreedLeader(t, a, b, c)
	waitFor(t, "a sees b's GPU", func() bool { i, _ := a.n.NodeInfo("b"); return len(i.Capacity.GPUs) == 1 })
	waitFor(t, "a sees c's GPU", func() bool { i, _ := a.n.NodeInfo("c"); return len(i.Capacity.GPUs) == 1 })
	p := project("gpu", 1, 2, 1, 16000)
	putProject(t, a.st, p)
	waitFor(t, "the GPU project is placed", func() bool {
		pl, ok := c.n.Placement("gpu")
		return ok && len(pl.Nodes) > 0
	})
	pl, _ := a.n.Placement("gpu")
	if want := map[string]Share{"b": {1, 2}}; !maps.Equal(pl.Nodes, want) || pl.Leader == "" {
		t.Errorf("placement = %+v, want %v", pl, want)
	}
	// Deleting the project drops its placement.
	if err := b.st.DeleteProject("gpu"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the placement of the deleted project goes", func() bool { _, ok := a.n.Placement("gpu"); return !ok })
}

// A project's minimum replicas, spread over two nodes, are placed on the
// survivors when one of them dies.
func TestMinReplicasArePlacedAgainAfterANodeDies(t *testing.T) {
	m := startMember(t)
	a, b, c := startNode(t, m, "a", 2), startNode(t, m, "b", 2), startNode(t, m, "c", 2)
	leader := agreedLeader(t, a, b, c)
	putProject(t, a.st, project("cpu", 2, 2, 0, 0))
	var first Placement
	waitFor(t, "the minimum is placed on two nodes", func() bool {
		first, _ = a.n.Placement("cpu")
		return len(first.Nodes) == 2
	})
	var victim *testNode
	for _, tn := range []*testNode{a, b, c} {
		if _, placed := first.Nodes[tn.n.Name()]; placed && tn != leader {
			victim = tn
			break
		}
	}
	victim.kill()
	waitFor(t, "the minimum is placed again without "+victim.n.Name(), func() bool {
		p, _ := leader.n.Placement("cpu")
		_, still := p.Nodes[victim.n.Name()]
		sum := 0
		for _, s := range p.Nodes {
			sum += s.Min
		}
		return !still && sum == 2 && len(p.Nodes) == 2
	})
}

// nextAdopted waits for the next call a or b adopts and returns it and
// the node.
func nextAdopted(t *testing.T, a, b *testNode) (id, node string) {
	t.Helper()
	select {
	case id := <-a.adopted:
		return id, a.n.Name()
	case id := <-b.adopted:
		return id, b.n.Name()
	case <-time.After(within):
		t.Fatal("no call was adopted")
		return "", ""
	}
}

// fakeNode stands for a node that will be lost: its key under a lease of
// its own, and calls written by its store.
func fakeNode(t *testing.T, m *etcd.Member, name string) (*etcd.Store, clientv3.LeaseID) {
	t.Helper()
	st, err := etcd.Open(etcd.Options{Endpoints: m.ClientURLs(), Node: name, Prefix: "/test/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	g, err := st.Client().Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := json.Marshal(NodeInfo{Name: name, Lease: int64(g.ID), Started: time.Now().UTC()})
	if _, err := st.Client().Put(ctx, st.Prefix()+NodesPrefix+name, string(v), clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	return st, g.ID
}

// A node's key vanishing hands its queued calls to a live node its
// project is placed on, re-runs its running calls whose project allows a
// retry, and fails the others with "node NAME was lost".
func TestLostNodesCallsAreHandedOverOrFailed(t *testing.T) {
	m := startMember(t)
	a, b := startNode(t, m, "a", 2), startNode(t, m, "b", 2)
	leader := agreedLeader(t, a, b)
	once := project("once", 0, 1, 0, 0)
	again := project("again", 0, 1, 0, 0)
	again.Retries = 1
	putProject(t, a.st, once)
	putProject(t, a.st, again)
	waitFor(t, "both projects placed", func() bool {
		_, ok1 := a.n.Placement("once")
		_, ok2 := a.n.Placement("again")
		return ok1 && ok2
	})
	x, lease := fakeNode(t, m, "x")
	waitFor(t, "x is seen", func() bool { _, ok := a.n.NodeInfo("x"); return ok })
	now := time.Now().UTC()
	calls := []store.Call{
		{ID: "call_queued", ProjectID: "once", TeamID: "acme", State: store.CallQueued, Created: now, Inputs: []byte(`{}`), QueueTimeout: 30},
		{ID: "call_running", ProjectID: "once", TeamID: "acme", State: store.CallRunning, Attempt: 1, Created: now, Dispatched: now,
			Webhook: "http://127.0.0.1:9/hook", WebhookEvents: []string{store.EventStart, store.EventCompleted}},
		{ID: "call_retry", ProjectID: "again", TeamID: "acme", State: store.CallRunning, Attempt: 1, Created: now, Dispatched: now, QueueTimeout: 30},
	}
	for _, c := range calls {
		if err := x.SaveCall(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := x.Client().Revoke(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	adopted := map[string]string{} // call → node
	for range 2 {
		id, node := nextAdopted(t, a, b)
		adopted[id] = node
	}
	// A running call handed over keeps its attempt (the next dispatch
	// counts the new one) and loses its queue deadline: it was dispatched
	// in time.
	for id, want := range map[string]struct {
		project      string
		attempt      int
		queueTimeout int
	}{"call_queued": {"once", 0, 30}, "call_retry": {"again", 1, 0}} {
		project := want.project
		node, ok := adopted[id]
		pl, _ := a.n.Placement(project)
		if _, placed := pl.Nodes[node]; !ok || !placed {
			t.Errorf("%s adopted by %q; want a node %s is placed on (%v)", id, node, project, pl.Nodes)
		}
		c, err := a.st.GetCall(id)
		if err != nil || c.State != store.CallQueued || c.Attempt != want.attempt || !c.Dispatched.IsZero() || c.QueueTimeout != want.queueTimeout {
			t.Errorf("%s = %+v, %v; want queued, attempt %d, queueTimeout %d", id, c, err, want.attempt, want.queueTimeout)
		}
		waitFor(t, id+"'s assign key is deleted", func() bool {
			resp, err := a.st.Client().Get(context.Background(), a.st.Prefix()+AssignPrefix+node+"/"+id)
			return err == nil && len(resp.Kvs) == 0
		})
	}
	c, err := a.st.GetCall("call_running")
	if err != nil || c.State != store.CallFailed || c.Message != "error: node x was lost" {
		t.Errorf("call_running = %+v, %v; want failed: node x was lost", c, err)
	}
	if nodes, err := a.st.NodesWithCalls(); err != nil || slices.Contains(nodes, "x") {
		t.Errorf("nodes with calls = %v, %v; want x's all moved", nodes, err)
	}
	// Its webhooks are the leader's to send: the start x queued and never
	// sent, and the completion of the call that failed.
	waitFor(t, "the leader holds call_running's webhooks", func() bool {
		ds, err := leader.st.PendingDeliveries()
		var events []string
		for _, d := range ds {
			if d.CallID == "call_running" {
				events = append(events, d.Event)
			}
		}
		slices.Sort(events)
		return err == nil && slices.Equal(events, []string{store.EventCompleted, store.EventStart})
	})
	if ds, err := x.PendingDeliveries(); err != nil || len(ds) != 0 {
		t.Errorf("x still holds deliveries %+v, %v", ds, err)
	}
}

// A project whose placed node runs all it may with calls queued is given
// another node, from the loads the nodes publish.
func TestABusyProjectIsGivenAnotherNode(t *testing.T) {
	m := startMember(t)
	a, b := startNode(t, m, "a", 1), startNode(t, m, "b", 1)
	agreedLeader(t, a, b)
	putProject(t, a.st, project("busy", 0, 2, 0, 0))
	var first string
	waitFor(t, "the project is placed on one node", func() bool {
		p, ok := a.n.Placement("busy")
		for n := range p.Nodes {
			first = n
		}
		return ok && len(p.Nodes) == 1
	})
	placed, other := a, b
	if first == "b" {
		placed, other = b, a
	}
	placed.setLoad(func() (Capacity, map[string]ProjectLoad) {
		return Capacity{CPUSlots: 1, CPUUsed: 1}, map[string]ProjectLoad{"busy": {Replicas: 1, Ready: 1, Busy: 1, Queued: 4, Max: 1}}
	})
	waitFor(t, "the project is placed on both nodes", func() bool {
		p, _ := a.n.Placement("busy")
		_, added := p.Nodes[other.n.Name()]
		return added && len(p.Nodes) == 2
	})
}

// A node whose key vanished and came back from the same process (fenced,
// rejoined) abandoned its calls: those written before its key vanished
// are handed over, those written since stay. A node back from a restart
// (another start time) recovers its own calls: they stay.
func TestCallsOfAFencedNodeMoveButARestartedNodeKeepsThem(t *testing.T) {
	m := startMember(t)
	a, b := startNode(t, m, "a", 2), startNode(t, m, "b", 2)
	leader := agreedLeader(t, a, b)
	f, _ := leader.n.leadingFence()
	putProject(t, a.st, project("once", 0, 1, 0, 0))
	waitFor(t, "the project is placed", func() bool { _, ok := a.n.Placement("once"); return ok })
	x, _ := fakeNode(t, m, "x")
	resp, err := x.Client().Get(context.Background(), x.Prefix()+NodesPrefix+"x")
	if err != nil {
		t.Fatal(err)
	}
	var info NodeInfo
	if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
		t.Fatal(err)
	}
	save := func(id string) {
		c := store.Call{ID: id, ProjectID: "once", TeamID: "acme", State: store.CallQueued, Created: time.Now().UTC()}
		if err := x.SaveCall(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	save("call_old")
	now, err := x.Client().Get(context.Background(), "any")
	if err != nil {
		t.Fatal(err)
	}
	vanished := func(started time.Time) {
		gone := info
		gone.Started = started
		v, _ := json.Marshal(gone)
		leader.n.nodeChanged(change{name: "x", deleted: true, rev: now.Header.Revision + 1, prev: v})
		projects, err := leader.st.ListProjects("")
		if err != nil {
			t.Fatal(err)
		}
		if err := leader.n.handleLost(context.Background(), f, projects, true); err != nil {
			t.Fatal(err)
		}
	}
	vanished(info.Started.Add(-time.Hour)) // restarted
	if got, err := leader.st.CallsOfNode("x"); err != nil || len(got) != 1 {
		t.Fatalf("after a restart x holds %v, %v; want call_old still", got, err)
	}
	save("call_new")
	vanished(info.Started) // fenced and back
	got, err := leader.st.CallsOfNode("x")
	if err != nil || len(got) != 1 || got[0].Call.ID != "call_new" {
		t.Fatalf("after a rejoin x holds %v, %v; want call_new only", got, err)
	}
	if id, node := nextAdopted(t, a, b); id != "call_old" {
		t.Errorf("%s adopted %s, want call_old", node, id)
	}
}

// cutProxy forwards TCP to etcd until cut: then it closes every
// connection and refuses new ones, as a node cut off from etcd sees it.
type cutProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
	// stalled: connections stay open but nothing passes either way, as
	// with an etcd member that has no quorum (requests go unanswered)
	// or a network that drops packets.
	stalled atomic.Bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: strings.TrimPrefix(target, "http://")}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(up, c) })
		p.wg.Go(func() { p.pipe(c, up) })
	}
}

// pipe copies src to dst, dropping what it reads while stalled.
func (p *cutProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.stalled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// A node cut off from etcd is fenced once its lease lapses (while still
// cut off: nothing waits on etcd first), the others see its key vanish,
// and once the cut heals it rejoins under a new lease.
func TestACutOffNodeIsFencedAndRejoinsAfterHealing(t *testing.T) {
	m := startMember(t)
	a := startNode(t, m, "a", 2)
	proxy := newCutProxy(t, m.ClientURLs()[0])
	b := startNodeAt(t, proxy.url(), "b", 2*time.Second)
	agreedLeader(t, a, b)
	before, _ := a.n.NodeInfo("b")
	proxy.setCut(true)
	select {
	case <-b.fenced:
	case <-time.After(within):
		t.Fatal("the cut-off node was not fenced")
	}
	if b.n.Live() {
		t.Error("a fenced node says it is live")
	}
	waitFor(t, "a sees b's key vanish", func() bool { _, ok := a.n.NodeInfo("b"); return !ok })
	proxy.setCut(false)
	waitFor(t, "b rejoins", func() bool {
		info, ok := a.n.NodeInfo("b")
		return ok && info.Lease != before.Lease && b.n.Live()
	})
	agreedLeader(t, a, b)
}

// A node fenced while etcd could not end its lease (the whole cluster
// without quorum: a lease ends only while etcd has a leader, and a new
// raft leader extends every lease) revokes that lease before it joins
// again: its key vanishes first, so the leader hands over the calls it
// abandoned, rather than leave them pending on it for good. Here the
// test keeps the node's lease alive at etcd while the node is cut off, as
// a cluster without quorum does.
func TestAFencedNodeWhoseLeaseOutlivedTheCutHandsOverItsCalls(t *testing.T) {
	m := startMember(t)
	a := startNode(t, m, "a", 2)
	proxy := newCutProxy(t, m.ClientURLs()[0])
	b := startNodeAt(t, proxy.url(), "b", 2*time.Second)
	agreedLeader(t, a, b)
	putProject(t, a.st, project("once", 0, 1, 0, 0))
	waitFor(t, "the project is placed", func() bool { _, ok := a.n.Placement("once"); return ok })
	c := store.Call{ID: "call_abandoned", ProjectID: "once", TeamID: "acme", State: store.CallQueued, Created: time.Now().UTC()}
	if err := b.st.SaveCall(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	before, _ := a.n.NodeInfo("b")
	ctx, stopKeeping := context.WithCancel(context.Background())
	defer stopKeeping()
	if _, err := a.st.Client().KeepAlive(ctx, clientv3.LeaseID(before.Lease)); err != nil {
		t.Fatal(err)
	}
	proxy.setCut(true)
	select {
	case <-b.fenced:
	case <-time.After(within):
		t.Fatal("the cut-off node was not fenced")
	}
	if _, ok := a.n.NodeInfo("b"); !ok {
		t.Fatal("b's key vanished while its lease was kept alive: the test stands for nothing")
	}
	proxy.setCut(false)
	if id, node := nextAdopted(t, a, b); id != c.ID || node != "a" {
		t.Errorf("%s adopted %s; want a to adopt %s, abandoned by b", node, id, c.ID)
	}
	waitFor(t, "b back under a new lease", func() bool {
		info, ok := a.n.NodeInfo("b")
		return ok && info.Lease != before.Lease && b.n.Live()
	})
}

// A node that leads and whose etcd does not answer (no quorum for it)
// shuts down within leaveTimeout and a little: it does not wait out a
// resign and a revoke that cannot be answered, nor a put of its load in
// flight, and revokes while its leader's work ends; its lease lapses by
// itself and another node leads.
func TestShutdownWithoutEtcdIsBounded(t *testing.T) {
	m := startMember(t)
	proxy := newCutProxy(t, m.ClientURLs()[0])
	b := startNodeAt(t, proxy.url(), "b", 0)
	waitFor(t, "b leads", func() bool { _, ok := b.n.leadingFence(); return ok })
	a := startNode(t, m, "a", 2)
	agreedLeader(t, a, b)
	proxy.stalled.Store(true)
	t0 := time.Now()
	b.kill()
	// The node's store reads are bounded at 1 s here (startNodeOn), and
	// end with the revoke's bound.
	if took := time.Since(t0); took > leaveTimeout+2*time.Second {
		t.Errorf("a leader cut off from etcd took %s to shut down; want at most leaveTimeout (%s) and a little", took, leaveTimeout)
	}
	waitFor(t, "a leads once b's lease lapsed", func() bool { return slices.Equal(leaders(a), []string{"a"}) })
}

// A node lost while no node led (its key gone before any leader watched)
// is found by the new leader's first scan of the pending calls.
func TestANewLeaderFindsCallsOfANodeLostBeforeIt(t *testing.T) {
	m := startMember(t)
	ghost, err := etcd.Open(etcd.Options{Endpoints: m.ClientURLs(), Node: "ghost", Prefix: "/test/"})
	if err != nil {
		t.Fatal(err)
	}
	defer ghost.Close()
	putProject(t, ghost, project("once", 0, 1, 0, 0))
	c := store.Call{ID: "call_orphan", ProjectID: "once", TeamID: "acme", State: store.CallQueued, Created: time.Now().UTC()}
	if err := ghost.SaveCall(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	a, b := startNode(t, m, "a", 2), startNode(t, m, "b", 2)
	agreedLeader(t, a, b)
	if id, node := nextAdopted(t, a, b); id != "call_orphan" {
		t.Errorf("%s adopted %s, want call_orphan", node, id)
	}
}

// A call handed to a node whose Adopt fails (etcd not answering) is tried
// again, and its assign key kept until it is taken: it is not left pending
// on the node unadopted.
func TestAdoptIsTriedAgainUntilTheCallIsTaken(t *testing.T) {
	m := startMember(t)
	a := startNode(t, m, "a", 2)
	a.mu.Lock()
	a.adoptFails = 2
	a.mu.Unlock()
	key := a.st.Prefix() + AssignPrefix + "a/call_x"
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if _, err := a.st.Client().Put(ctx, key, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-a.adopted:
		if id != "call_x" {
			t.Fatalf("adopted %s, want call_x", id)
		}
	case <-time.After(within):
		t.Fatal("the handed call was never adopted after Adopt failed")
	}
	a.mu.Lock()
	tried := a.adoptsTried
	a.mu.Unlock()
	if tried != 3 {
		t.Errorf("Adopt tried %d times, want 3 (two failures, then the call)", tried)
	}
	waitFor(t, "the assign key deleted once the call was taken", func() bool {
		resp, err := a.st.Client().Get(ctx, key)
		return err == nil && len(resp.Kvs) == 0
	})
}

// A team's quota is leased to the nodes: every node's share is for its
// own lease, the shares add up to the quota, and the node that wants more
// (its calls waiting) gets the larger part once the other confirms it holds
// the team to the newest record.
func TestTheLeaderLeasesATeamsQuotaToTheNodesByWhatTheyWant(t *testing.T) {
	m := startMember(t)
	a, b := startNode(t, m, "a", 2), startNode(t, m, "b", 2)
	var wmu sync.Mutex
	wants := map[string]int{"a": 0, "b": 0}
	for _, tn := range []*testNode{a, b} {
		tn.mu.Lock()
		tn.teams = func(n *Node) map[string]TeamLoad {
			share, rev := n.TeamShare("acme")
			wmu.Lock()
			defer wmu.Unlock()
			return map[string]TeamLoad{"acme": {Rev: rev, Share: share, Want: store.Quota{RunningCalls: wants[n.Name()]}}}
		}
		tn.mu.Unlock()
	}
	agreedLeader(t, a, b)
	if _, err := a.st.SetTeamQuota("acme", store.Quota{RunningCalls: 4, QueuedCalls: 9}); err != nil {
		t.Fatal(err)
	}
	shares := func() (int, int) {
		sa, _ := a.n.TeamShare("acme")
		sb, _ := b.n.TeamShare("acme")
		return sa.RunningCalls, sb.RunningCalls
	}
	waitFor(t, "the idle quota spread over both nodes", func() bool { x, y := shares(); return x == 2 && y == 2 })
	wmu.Lock()
	wants["b"] = 9 // b's calls wait
	wmu.Unlock()
	waitFor(t, "b given the quota nobody else wants", func() bool { x, y := shares(); return x == 0 && y == 4 })
	if x, y := shares(); x+y > 4 {
		t.Errorf("shares %d + %d over the quota 4", x, y)
	}
	if q, _ := a.n.TeamShare("labs"); q != (store.Quota{}) {
		t.Errorf("a team without a quota record: share %+v; want none", q)
	}
}
