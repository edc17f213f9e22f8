package cluster

import (
	"context"
	"slices"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A key deleted and put again while the cache's watch was broken (a node
// fenced and rejoined during an etcd leader change) is told, at the next
// listing, as vanished at the new key's creation, then created: the leader
// hands on what the node held before it vanished.
func TestCacheListingTellsAKeyDeletedAndPutAgain(t *testing.T) {
	m := startMember(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.ClientURLs()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const dir = "/test/" + NodesPrefix
	var (
		mu   sync.Mutex
		told []change
	)
	c := newCache(dir, func(ch change) { mu.Lock(); told = append(told, ch); mu.Unlock() })
	ctx := context.Background()
	if _, err := cli.Put(ctx, dir+"x", "before"); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.list(ctx, cli); !ok {
		t.Fatal("first listing failed")
	}
	if _, err := cli.Delete(ctx, dir+"x"); err != nil {
		t.Fatal(err)
	}
	again, err := cli.Put(ctx, dir+"x", "after")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	told = nil
	mu.Unlock()
	if _, ok := c.list(ctx, cli); !ok {
		t.Fatal("second listing failed")
	}
	mu.Lock()
	defer mu.Unlock()
	vanished := slices.IndexFunc(told, func(ch change) bool { return ch.name == "x" && ch.deleted })
	created := slices.IndexFunc(told, func(ch change) bool { return ch.name == "x" && ch.created && !ch.deleted })
	if vanished < 0 || created < vanished {
		t.Fatalf("told %+v; want x vanished, then created", told)
	}
	if ch := told[vanished]; ch.rev != again.Header.Revision || string(ch.prev) != "before" {
		t.Errorf("x vanished at %d with %q; want at %d (its new creation) with %q", ch.rev, ch.prev, again.Header.Revision, "before")
	}
}
