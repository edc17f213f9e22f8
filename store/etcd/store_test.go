package etcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/internal/testenv"
	"inferd/store"
	"inferd/store/storetest"
)

// Two stores over one etcd stand for two inferd nodes: what one writes, the
// other sees at once, with no cache in between to go stale.
func TestWritesThroughOneNodeAreSeenAtOnceByAnother(t *testing.T) {
	n1, n2 := twoNodes(t)

	secret, k, err := n1.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := n2.Authenticate(secret); err != nil || got.ID != k.ID {
		t.Fatalf("node 2 Authenticate = %+v, %v; want key %s", got, err, k.ID)
	}
	if _, err := n1.PutProject(storetest.Project("resnet", "acme")); err != nil {
		t.Fatal(err)
	}
	if p, err := n2.ProjectByModelKey("key-resnet"); err != nil || p.ID != "resnet" {
		t.Fatalf("node 2 ProjectByModelKey = %+v, %v", p, err)
	}
	// Node 2 reads both again and again (a warm path), then node 1
	// revokes and deletes: node 2's very next reads refuse.
	for range 3 {
		if _, err := n2.Authenticate(secret); err != nil {
			t.Fatal(err)
		}
		if _, err := n2.ProjectByModelKey("key-resnet"); err != nil {
			t.Fatal(err)
		}
	}
	if err := n1.RevokeKey(k.ID); err != nil {
		t.Fatal(err)
	}
	if err := n1.DeleteProject("resnet"); err != nil {
		t.Fatal(err)
	}
	if _, err := n2.Authenticate(secret); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("node 2 Authenticate after node 1 revoked = %v, want ErrInvalidKey", err)
	}
	if _, err := n2.ProjectByModelKey("key-resnet"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node 2 ProjectByModelKey after node 1 deleted = %v, want ErrNotFound", err)
	}
	call := store.Call{ID: "call_1", ProjectID: "resnet", TeamID: "acme", State: store.CallSucceeded,
		Outputs: []byte(`{"ok":true}`), Message: "success"}
	if err := n1.SaveCall(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	if got, err := n2.GetCall("call_1"); err != nil || string(got.Outputs) != `{"ok":true}` {
		t.Errorf("node 2 GetCall = %+v, %v", got, err)
	}
}

// Updates racing through two nodes each apply once: the revision compare
// makes the loser read again instead of writing over the winner.
func TestConcurrentUpdatesThroughTwoNodesAllApply(t *testing.T) {
	n1, n2 := twoNodes(t)
	nodes := []*Store{n1, n2}
	p := storetest.Project("p", "t")
	p.MaxReplicas = 1
	if _, err := nodes[0].PutProject(p); err != nil {
		t.Fatal(err)
	}
	const perNode = 8
	var wg sync.WaitGroup
	for _, n := range nodes {
		for range perNode {
			wg.Go(func() {
				if _, err := n.UpdateProject("p", func(p *store.Project) error { p.MaxReplicas++; return nil }); err != nil {
					t.Error(err)
				}
			})
		}
	}
	wg.Wait()
	got, err := nodes[1].GetProject("p")
	if want := 1 + 2*perNode; err != nil || got.MaxReplicas != want {
		t.Errorf("maxReplicas = %d, %v; want %d", got.MaxReplicas, err, want)
	}
}

// A modelKey claimed by two projects at once through two nodes ends with
// one owner: one write wins, the other is a conflict.
func TestModelKeyRaceThroughTwoNodesHasOneWinner(t *testing.T) {
	n1, n2 := twoNodes(t)
	nodes := []*Store{n1, n2}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			p := storetest.Project(fmt.Sprintf("p%d", i), "t")
			p.Model.KeyHash = store.HashModelKey("shared")
			_, errs[i] = n.PutProject(p)
		})
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("errors = %v, %v; want exactly one conflict", errs[0], errs[1])
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, store.ErrConflict) {
			t.Errorf("loser's error = %v, want ErrConflict", err)
		}
	}
	ps, err := nodes[0].ListProjects("")
	if err != nil || len(ps) != 1 {
		t.Errorf("projects = %+v, %v; want the winner only", ps, err)
	}
}

// The data survives the etcd member itself stopping and starting again
// from its data directory (a whole-cluster restart), not only a new client.
func TestRecordsSurviveAMemberRestart(t *testing.T) {
	dir := t.TempDir()
	m := startMember(t, dir)
	s := openStore(t, m, Options{})
	secret, _, err := s.CreateKey("acme", store.ScopeAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutProject(storetest.Project("resnet", "acme")); err != nil {
		t.Fatal(err)
	}
	call := store.Call{ID: "call_q", ProjectID: "resnet", TeamID: "acme", State: store.CallQueued, Inputs: []byte(`[1]`)}
	if err := s.SaveCall(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	s.Close()
	m.Close()

	m = startMemberAt(t, dir, m)
	s = openStore(t, m, Options{})
	defer s.Close()
	if _, err := s.Authenticate(secret); err != nil {
		t.Errorf("Authenticate after restart: %v", err)
	}
	if _, err := s.ProjectByModelKey("key-resnet"); err != nil {
		t.Errorf("ProjectByModelKey after restart: %v", err)
	}
	if pending, err := s.PendingCalls(); err != nil || len(pending) != 1 || pending[0].InputBytes != 3 {
		t.Errorf("PendingCalls after restart = %+v, %v", pending, err)
	}
	if in, err := s.CallInputs("call_q"); err != nil || string(in) != `[1]` {
		t.Errorf("CallInputs after restart = %s, %v", in, err)
	}
}

// startMemberAt starts a member again over dir, on the URLs old had (they
// are in its data).
func startMemberAt(t *testing.T, dir string, old *Member) *Member {
	t.Helper()
	cfg := old.e.Config()
	m, err := StartMember(MemberConfig{Name: cfg.Name, DataDir: dir,
		PeerURL: cfg.AdvertisePeerUrls[0].String(), ClientURL: cfg.AdvertiseClientUrls[0].String(),
		HeartbeatMs: 10, ElectionMs: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// Inputs or outputs over the inline limit are refused up front with the
// sentinel, and nothing is written; at the limit they are kept.
func TestPayloadOverInlineLimitIsRefused(t *testing.T) {
	m := startMember(t, t.TempDir())
	s := openStore(t, m, Options{})
	defer s.Close()
	big := []byte(`"` + strings.Repeat("x", MaxInlinePayload-1) + `"`) // MaxInlinePayload+1 bytes
	for _, tc := range []struct {
		name string
		c    store.Call
	}{
		{"inputs", store.Call{ID: "call_in", State: store.CallQueued, Inputs: big}},
		{"outputs", store.Call{ID: "call_out", State: store.CallSucceeded, Outputs: big}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.SaveCall(context.Background(), tc.c); !errors.Is(err, ErrPayloadTooLarge) {
				t.Errorf("SaveCall = %v, want ErrPayloadTooLarge", err)
			}
			if _, err := s.GetCall(tc.c.ID); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("GetCall of the refused call = %v, want ErrNotFound", err)
			}
		})
	}
	// At the limit both payloads fit one etcd request, and two such writes
	// queued together are committed apart.
	atLimit := []byte(`"` + strings.Repeat("x", MaxInlinePayload-2) + `"`)
	errs := make(chan error, 2)
	for _, id := range []string{"call_ok1", "call_ok2"} {
		s.SaveCallAsync(store.Call{ID: id, State: store.CallSucceeded, Inputs: atLimit, Outputs: atLimit},
			func(err error) { errs <- err })
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("SaveCall with inputs and outputs at the limit: %v", err)
		}
	}
}

// Writes queued together share transactions: 200 calls cost far fewer than
// 200 commits.
func TestQueuedCallWritesShareCommits(t *testing.T) {
	m := startMember(t, t.TempDir())
	s := openStore(t, m, Options{})
	defer s.Close()
	const n = 200
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		s.SaveCallAsync(store.Call{ID: fmt.Sprintf("call_%03d", i), State: store.CallQueued}, func(err error) {
			if err != nil {
				t.Error(err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	st := s.CommitStats()
	if st.Writes != n || st.Commits > n/4 {
		t.Errorf("CommitStats = %+v; want %d writes in at most %d commits", st, n, n/4)
	}
	if pending, err := s.PendingCalls(); err != nil || len(pending) != n {
		t.Errorf("PendingCalls = %d, %v; want %d", len(pending), err, n)
	}
}

// A prefix written by another layout version is refused, not misread.
func TestOpenRefusesAnotherLayoutVersion(t *testing.T) {
	m := startMember(t, t.TempDir())
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.ClientURLs()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(context.Background(), "/future/schema", "9"); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(Options{Endpoints: m.ClientURLs(), Prefix: "/future/"}); err == nil || !strings.Contains(err.Error(), `version "9"`) {
		if s != nil {
			s.Close()
		}
		t.Errorf("Open over a version 9 prefix = %v, want a refusal naming the version", err)
	}
}

// An unreachable etcd fails Open within the dial timeout with the
// endpoint in the message, instead of hanging.
func TestOpenFailsClearlyWhenEtcdIsUnreachable(t *testing.T) {
	ep := "http://" + testenv.FreeAddr(t)
	_, err := Open(Options{Endpoints: []string{ep}, DialTimeout: 300_000_000})
	if err == nil || !strings.Contains(err.Error(), ep) {
		t.Errorf("Open(%s) = %v, want an error naming it", ep, err)
	}
}

// A project written through one node reaches the other node's
// OnProjectChange hooks (its scheduler) through a watch, once per change.
func TestProjectChangesThroughAnotherNodeReachTheHooks(t *testing.T) {
	n1, n2 := twoNodes(t)
	told := make(chan string, 16)
	n2.OnProjectChange(func(id string) { told <- id })
	wait := func(step string) { t.Helper(); waitTold(t, told, "p", step) }
	if _, err := n1.PutProject(storetest.Project("p", "t")); err != nil {
		t.Fatal(err)
	}
	wait("create")
	if _, err := n1.UpdateProject("p", func(p *store.Project) error { p.MaxReplicas = 7; return nil }); err != nil {
		t.Fatal(err)
	}
	wait("update")
	if err := n1.DeleteProject("p"); err != nil {
		t.Fatal(err)
	}
	wait("delete")
	// Node 2's own write is told once, by the write itself.
	if _, err := n2.PutProject(storetest.Project("p", "t")); err != nil {
		t.Fatal(err)
	}
	wait("own create")
	if _, err := n1.PutProject(storetest.Project("q", "t")); err != nil {
		t.Fatal(err)
	}
	// Told once more for p (the watch repeating the own write) would fail here.
	waitTold(t, told, "q", "after node 2's own write, the next change")
}

// A team quota set through one node reaches the other node's OnTeamChange
// hooks; a team created on the side (by a key) is no quota change and is
// not told.
func TestQuotaChangesThroughAnotherNodeReachTheHooks(t *testing.T) {
	n1, n2 := twoNodes(t)
	told := make(chan string, 16)
	n2.OnTeamChange(func(id string) { told <- id })
	if _, _, err := n1.CreateKey("quiet", store.ScopeTeam); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.SetTeamQuota("acme", store.Quota{Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.SetTeamQuota("acme", store.Quota{Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// A key's implicit team is no quota change: told first would fail here.
	waitTold(t, told, "acme", "first quota")
	waitTold(t, told, "acme", "second quota")
	if got, err := n2.GetTeam("acme"); err != nil || got.Quota.Replicas != 3 {
		t.Errorf("node 2 GetTeam = %+v, %v; want replicas quota 3", got, err)
	}
}

// twoNodes starts an etcd member and two stores over it, standing for two
// inferd nodes; all are closed when the test ends.
func twoNodes(t *testing.T) (*Store, *Store) {
	t.Helper()
	m := startMember(t, t.TempDir())
	n1, n2 := openStore(t, m, Options{}), openStore(t, m, Options{})
	t.Cleanup(func() { n1.Close(); n2.Close() })
	return n1, n2
}

// waitTold waits for the next id a hook sent on told and checks it is want.
func waitTold(t *testing.T, told <-chan string, want, step string) {
	t.Helper()
	select {
	case id := <-told:
		if id != want {
			t.Fatalf("%s: hook told of %q, want %q", step, id, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the hook was not told of %q within 10s", step, want)
	}
}

// With etcd unreachable (quorum lost, or this node cut off), requests fail
// with store.ErrUnavailable within their bounds instead of hanging, and a
// key is not called invalid for it: the API then answers "cluster
// unavailable; retry", not 401.
func TestEtcdOutageFailsRequestsWithinBounds(t *testing.T) {
	m := startMember(t, t.TempDir())
	link := newLink(t, strings.TrimPrefix(m.ClientURLs()[0], "http://"))
	s, secret := openWithKey(t, Options{Endpoints: []string{"http://" + link.addr}, RequestTimeout: 300 * time.Millisecond, RetryFor: time.Second})
	link.cut()
	if _, err := s.Authenticate(secret); !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("Authenticate with etcd unreachable = %v, want ErrUnavailable, not ErrInvalidKey", err)
	}
	if _, err := s.GetProject("p"); !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetProject with etcd unreachable = %v, want ErrUnavailable, not ErrNotFound", err)
	}
	if _, err := s.GetCallResult("call_any"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("GetCallResult with etcd unreachable = %v, want ErrUnavailable", err)
	}
	// The call write is retried for RetryFor, then fails.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := s.SaveCall(ctx, store.Call{ID: "call_down", State: store.CallQueued})
	if !errors.Is(err, store.ErrUnavailable) || ctx.Err() != nil {
		t.Errorf("SaveCall with etcd unreachable = %v, want the write's own failure (ErrUnavailable) well before 30s", err)
	}
}

// link is a TCP relay between a store and etcd that a test can cut: the
// network between a node and the cluster.
type link struct {
	addr  string
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	cutAt bool
	down  bool // dropped until heal: new connections are closed at once
}

func newLink(t *testing.T, target string) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{addr: ln.Addr().String(), ln: ln}
	t.Cleanup(l.cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // cut
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			if !l.track(c, u) {
				continue // closed; after a cut the next Accept fails
			}
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return l
}

// track keeps the connections for cut, or closes them when the link is cut
// or down.
func (l *link) track(cs ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cutAt || l.down {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	l.conns = append(l.conns, cs...)
	return true
}

// drop closes every connection through the link and refuses new ones
// until heal: a node cut off for a while.
func (l *link) drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = true
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

func (l *link) heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = false
}

// cut closes the relay and every connection through it.
func (l *link) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cutAt = true
	l.ln.Close()
	for _, c := range l.conns {
		c.Close()
	}
}

// Each node recovers only the pending calls it wrote: a node restarting
// never takes over, or fails as interrupted, the calls another node holds.
func TestPendingCallsAreTheNodesOwn(t *testing.T) {
	m := startMember(t, t.TempDir())
	a := openStore(t, m, Options{Node: "a"})
	defer a.Close()
	b := openStore(t, m, Options{Node: "b"})
	defer b.Close()
	ctx := context.Background()
	for _, c := range []struct {
		s  *Store
		id string
	}{{a, "call_a1"}, {b, "call_b1"}, {a, "call_a2"}} {
		if err := c.s.SaveCall(ctx, store.Call{ID: c.id, State: store.CallQueued}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.SaveCall(ctx, store.Call{ID: "call_a2", State: store.CallSucceeded}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		node *Store
		want []string
	}{{a, []string{"call_a1"}}, {b, []string{"call_b1"}}} {
		if got := callIDs(tc.node.PendingCalls()); !slices.Equal(got, tc.want) {
			t.Errorf("node %s PendingCalls = %v, want %v", tc.node.node, got, tc.want)
		}
	}
	// Every node reads every call.
	if c, err := b.GetCall("call_a1"); err != nil || c.State != store.CallQueued {
		t.Errorf("node b GetCall(call_a1) = %+v, %v", c, err)
	}
}

func callIDs(calls []store.Call, err error) []string {
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var ids []string
	for _, c := range calls {
		ids = append(ids, c.ID)
	}
	return ids
}

// A batch of final calls with idempotency keys (the most operations a call
// write has) stays within etcd's 128 operations per transaction.
func TestFullBatchOfFinalCallsFitsOneTransaction(t *testing.T) {
	m := startMember(t, t.TempDir())
	s := openStore(t, m, Options{})
	defer s.Close()
	const n = 100
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		c := store.Call{ID: fmt.Sprintf("call_%03d", i), TeamID: "acme", State: store.CallSucceeded,
			Message: "success", IdempotencyKey: fmt.Sprintf("k%d", i)}
		s.SaveCallAsync(c, func(err error) {
			if err != nil {
				t.Error(err)
			}
			wg.Done()
		})
	}
	wg.Wait()
}
