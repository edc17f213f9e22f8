package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store/etcd"
)

// A session whose lease lapses before the node's key is put (etcd lost
// between the grant and the put) never joined: nothing was bound to its
// lease, so the node is not told it was fenced, and it joins with the next
// session. The daemon starts its scheduler only once a session has joined,
// and its OnFenced (the scheduler's Abandon) waits for the scheduler: told
// here, the node would never join.
func TestALeaseLostBeforeJoiningIsNotAFence(t *testing.T) {
	m := startMember(t)
	st, err := etcd.Open(etcd.Options{Endpoints: m.ClientURLs(), Node: "a", Prefix: "/test/", RequestTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cli := st.Client()
	var revoke sync.Once
	joined := make(chan struct{})
	var join sync.Once
	n, err := New(Options{
		Client: cli, Prefix: st.Prefix(), Name: "a", Store: st,
		// The first publish finds its lease revoked: its put fails.
		Load: func() (Capacity, map[string]ProjectLoad) {
			revoke.Do(func() {
				leases, err := cli.Leases(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				for _, l := range leases.Leases {
					if _, err := cli.Revoke(context.Background(), l.ID); err != nil {
						t.Error(err)
					}
				}
			})
			return Capacity{CPUSlots: 1}, nil
		},
		OnSession:    func(string, clientv3.LeaseID) { join.Do(func() { close(joined) }) },
		OnFenced:     func() { <-joined }, // as the scheduler's Abandon before it runs
		Log:          zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel),
		PublishEvery: 20 * time.Millisecond, RecheckEvery: 100 * time.Millisecond, Retry: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case <-joined:
	case <-time.After(within):
		join.Do(func() { close(joined) }) // lets the node's Run end
		t.Fatal("the node never joined after its first lease was lost before joining")
	}
	waitFor(t, "the node is live", n.Live)
}
