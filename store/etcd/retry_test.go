package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"inferd/store"
)

// threeMembers starts a 3-member etcd cluster on free loopback ports, with
// test raft timing (10 ms heartbeat, 100 ms election), stopped when the
// test ends.
func threeMembers(t *testing.T) []*Member {
	t.Helper()
	cfgs := make([]MemberConfig, 3)
	initial := ""
	for i := range cfgs {
		cfgs[i] = MemberConfig{Name: fmt.Sprintf("m%d", i), DataDir: t.TempDir(),
			PeerURL: "http://" + freeAddr(t), ClientURL: "http://" + freeAddr(t),
			HeartbeatMs: 10, ElectionMs: 100, StartTimeout: 30 * time.Second}
		if i > 0 {
			initial += ","
		}
		initial += cfgs[i].Name + "=" + cfgs[i].PeerURL
	}
	ms := make([]*Member, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range cfgs {
		cfgs[i].InitialCluster = initial
		wg.Go(func() { ms[i], errs[i] = StartMember(cfgs[i]) })
	}
	wg.Wait()
	for i, m := range ms {
		if m != nil {
			t.Cleanup(func() { m.Close() })
		}
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
	}
	return ms
}

// leaderOf returns the index of the member that leads the raft now.
func leaderOf(t *testing.T, ms []*Member) int {
	t.Helper()
	for i, m := range ms {
		if m.e.Server.Leader() == m.e.Server.MemberID() {
			return i
		}
	}
	t.Fatal("no member leads")
	return -1
}

// kill stops the member at once, as a kill -9 would: no leadership
// transfer, no goodbye to its peers.
func (m *Member) kill() { m.e.Server.HardStop() }

// A steady trickle of reads and call writes through a surviving member,
// from the moment the raft leader dies until well after etcd has elected
// another: each request caught by the change is sent again after its try's
// bound, so none waits out the request's whole bound (what an inferd node
// paused for when another node's etcd member was killed).
func TestRequestsCaughtByALeaderChangeAnswerWithinTheElection(t *testing.T) {
	ms := threeMembers(t)
	lead := leaderOf(t, ms)
	via := ms[(lead+1)%3] // a node's own member, which survives
	s, err := Open(Options{Endpoints: via.ClientURLs(), RequestTimeout: 5 * time.Second, RetryFor: 15 * time.Second,
		TryTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	secret, _, err := s.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	saveCall(t, s, finalCall("call_before"))

	ms[lead].kill()
	start := time.Now()
	var worst time.Duration
	for i := 0; time.Since(start) < 2*time.Second; i++ {
		t0 := time.Now()
		if err := s.SaveCall(context.Background(), finalCall(fmt.Sprintf("call_during_%d", i))); err != nil {
			t.Fatalf("SaveCall %d after the leader died: %v", i, err)
		}
		if _, err := s.Authenticate(secret); err != nil {
			t.Fatalf("Authenticate %d after the leader died: %v", i, err)
		}
		if _, err := s.GetCallResult("call_before"); err != nil {
			t.Fatalf("GetCallResult %d after the leader died: %v", i, err)
		}
		worst = max(worst, time.Since(t0))
	}
	t.Logf("worst pause of a write and two reads while etcd changed leader: %s", worst)
	if worst > 2*time.Second {
		t.Errorf("a write and two reads took %s while etcd changed leader; want about the election and a try (300 ms), not the request's bound (5 s)", worst)
	}
}

// With quorum lost, a request is tried again until its whole bound has
// passed, then fails with store.ErrUnavailable: bounded, never hanging, and
// not given up at its first try's bound.
func TestQuorumLostFailsRequestsAtTheirBound(t *testing.T) {
	ms := threeMembers(t)
	const reqTO, retryFor = time.Second, 2 * time.Second
	s, err := Open(Options{Endpoints: ms[0].ClientURLs(), RequestTimeout: reqTO, RetryFor: retryFor,
		TryTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	secret, _, err := s.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	ms[1].kill()
	ms[2].kill()

	const slack = 1500 * time.Millisecond
	t0 := time.Now()
	_, err = s.Authenticate(secret)
	if took := time.Since(t0); !errors.Is(err, store.ErrUnavailable) || took < reqTO || took > reqTO+slack {
		t.Errorf("Authenticate without quorum = %v after %s; want ErrUnavailable after RequestTimeout (%s)", err, took, reqTO)
	}
	t0 = time.Now()
	err = s.SaveCall(context.Background(), finalCall("call_lost"))
	if took := time.Since(t0); !errors.Is(err, store.ErrUnavailable) || took < retryFor || took > retryFor+slack {
		t.Errorf("SaveCall without quorum = %v after %s; want ErrUnavailable after RetryFor (%s)", err, took, retryFor)
	}
}
