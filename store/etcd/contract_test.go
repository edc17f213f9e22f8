package etcd

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/store"
	"inferd/store/storetest"
)

// startMember runs a one-member etcd cluster for a test, on free loopback
// ports, with test raft timing (10/100 ms), stopped when the test ends.
func startMember(t testing.TB, dir string) *Member {
	t.Helper()
	m, err := StartMember(MemberConfig{
		Name: "test", DataDir: dir,
		PeerURL: "http://" + testenv.FreeAddr(t), ClientURL: "http://" + testenv.FreeAddr(t),
		HeartbeatMs: 10, ElectionMs: 100, StartTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func openStore(t testing.TB, m *Member, opts Options) *Store {
	t.Helper()
	opts.Endpoints = m.ClientURLs()
	s, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// TestContract runs the store contract suite against one embedded member;
// each case has a key prefix of its own (its data set), and a reopen is a
// new Open, with a new client, over the same prefix.
func TestContract(t *testing.T) {
	m := startMember(t, t.TempDir())
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T, now func() time.Time) func() store.Store {
		prefix := fmt.Sprintf("/contract-%d/", n.Add(1))
		return func() store.Store {
			return openStore(t, m, Options{Prefix: prefix, Now: now})
		}
	})
}
