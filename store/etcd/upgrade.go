package etcd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// schemaVersion is the key layout this code reads and writes (see doc.go).
// Layout 3 is layout 2 with a final write's small payloads in the call's
// record: every key of layout 2 means what it did, so a layout 3 node reads
// layout 2 data as it is, and the upgrade writes only the version.
const schemaVersion = "3"

// upgradableFrom is the layout a node of this release upgrades (upgrade).
const upgradableFrom = "2"

// NodesDir is where, under the store's prefix, cluster mode's nodes keep
// their keys under their leases (package cluster's NodesPrefix): a node is
// live while its key exists. An upgrade of the layout waits for the nodes
// of an earlier release to go.
const NodesDir = "nodes"

// DefaultUpgradeWait is how long Open waits for the live nodes of an
// earlier release to go when Options.UpgradeWait is 0: three of package
// cluster's lease TTLs, so that the keys of nodes stopped just before (or
// those a restored snapshot holds, whose leases lapse once it runs) go.
const DefaultUpgradeWait = 15 * time.Second

// upgrade moves a prefix of layout 2 to layout 3, and returns the revision
// it read at. A layout 2 node reads a layout 3 call's payloads wrongly (it
// finds no outputs/ key where the record holds them), so the version is
// written only while no node but this one (Options.Node) is live: one
// transaction compares the version and that no other key is under
// nodes/. While some are, it waits for their keys to go (a watch), up to
// wait, and then refuses, naming them: nodes of two layouts never write
// into one cluster, and a rolling upgrade to layout 3 stops at its first
// node (docs/cluster.md, "Upgrades"). Another node of this release that
// upgraded first is as good.
func (s *Store) upgrade(wait time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	k, dir := s.key("schema"), s.key(NodesDir)+"/"
	self := dir + s.node
	var live []string // the other nodes' keys found last
	refuse := func() error {
		slices.Sort(live)
		return fmt.Errorf("prefix %s holds layout version %s, which this inferd upgrades to %s only while no node of an earlier release runs: "+
			"nodes %s are live; stop inferd on every node of the earlier release, then start this one (docs/cluster.md, Upgrades)",
			s.prefix, upgradableFrom, schemaVersion, strings.Join(live, ", "))
	}
	for {
		resp, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(k), "=", upgradableFrom),
				// No key in nodes/ but this node's own (one left by its
				// last run, whose lease has not lapsed yet).
				clientv3.Compare(clientv3.CreateRevision(dir), "=", 0).WithRange(self),
				clientv3.Compare(clientv3.CreateRevision(self+"\x00"), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(dir))).
			Then(clientv3.OpPut(k, schemaVersion)).
			Else(clientv3.OpGet(k), clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
		if err != nil && live != nil && ctx.Err() != nil {
			return 0, refuse()
		}
		if err != nil {
			return 0, fmt.Errorf("upgrade the key layout from version %s to %s: etcd: %w", upgradableFrom, schemaVersion, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		v, _ := valueOf(resp, 0)
		switch string(v) {
		case schemaVersion:
			return resp.Header.Revision, nil // another node upgraded it
		case upgradableFrom:
		default:
			return 0, fmt.Errorf("prefix %s holds layout version %q; this inferd reads version %s", s.prefix, v, schemaVersion)
		}
		live = live[:0]
		for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
			if name := strings.TrimPrefix(string(kv.Key), dir); name != s.node {
				live = append(live, name)
			}
		}
		if !s.nodesChange(ctx, dir, resp.Header.Revision+1) {
			return 0, refuse()
		}
	}
}

// nodesChange waits for a change under dir (a node's key put or gone) from
// revision rev on, and reports false when ctx ends first.
func (s *Store) nodesChange(ctx context.Context, dir string, rev int64) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for resp := range s.cli.Watch(wctx, dir, clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if resp.Err() != nil {
			return ctx.Err() == nil
		}
		if len(resp.Events) > 0 {
			return true
		}
	}
	return false
}
