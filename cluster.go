package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/cluster"
	"inferd/config"
	"inferd/httpapi"
	"inferd/httpapi/admin"
	"inferd/httpapi/metrics"
	"inferd/scheduler"
	"inferd/scheduler/backend"
	"inferd/store"
	"inferd/store/bolt"
	"inferd/store/etcd"
)

// daemonStore is what serve needs of its store; the bbolt and etcd stores
// both have it.
type daemonStore interface {
	store.Store
	metrics.StoreStats
	RunSweeper(ctx context.Context, ttl, every time.Duration, outages store.Outages) error
}

// openedStore is the daemon's store, with what else was started for it.
type openedStore struct {
	daemonStore
	member *etcd.Member // this node's etcd member; nil when it runs none
	etcd   *etcd.Store  // the store in cluster mode; nil on a single box
	// In cluster mode: the signer of requests between nodes (from
	// cluster.secretFile) and the payloads over the inline limit held on
	// this node (<dataDir>/payloads).
	signer   *cluster.Signer
	payloads *cluster.PayloadStore
}

// Close closes the store, then the member it talked to.
func (o openedStore) Close() error {
	err := o.daemonStore.Close()
	if o.member != nil {
		o.member.Close()
	}
	return err
}

// startLookup is how the API reads a start's key and project together:
// the etcd store's one round trip in cluster mode (etcd.Store.LookupStart);
// nil on a single box, whose store answers both from memory.
func (o openedStore) startLookup() func(secret, modelKey string) store.StartLookup {
	if o.etcd == nil {
		return nil
	}
	return o.etcd.LookupStart
}

// finals tells the scheduler of calls made final through any node (the
// etcd store's OnCallFinal: a scheduler.FinalFeed), so that a long poll
// here on a call run on another node wakes when it is final; nil on a
// single box.
func (o openedStore) finals() interface{ OnCallFinal(fn func(id string)) } {
	if f, ok := o.daemonStore.(interface{ OnCallFinal(fn func(id string)) }); ok {
		return f
	}
	return nil
}

// memberErr is the channel of the member's fatal errors; nil (never ready)
// when the node runs no member.
func (o openedStore) memberErr() <-chan error {
	if o.member == nil {
		return nil
	}
	return o.member.Err()
}

// openStore opens the single box's bbolt file, or with a cluster: section
// the etcd store, starting this node's etcd member first when it runs one.
func openStore(cfg config.Config, log zerolog.Logger) (openedStore, error) {
	if cfg.Cluster == nil {
		st, err := bolt.Open(cfg.StorePath(), bolt.Options{})
		if err != nil {
			return openedStore{}, withRestoreHint(err)
		}
		if m := st.Migration(); m.Migrated() {
			log.Warn().Int("from", m.From).Int("to", m.To).Str("copy", m.Copy).
				Msg("migrated the data file to a newer schema; the copy holds the old data for a downgrade")
		}
		return openedStore{daemonStore: st}, nil
	}
	c := cfg.Cluster
	// The secret first: a node that cannot sign or check requests between
	// nodes must not join.
	secret, err := cluster.ReadSecret(c.SecretFile)
	if err != nil {
		return openedStore{}, fmt.Errorf("cluster.secretFile: %w", err)
	}
	signer, err := cluster.NewSigner(c.Name, secret, nil)
	if err != nil {
		return openedStore{}, fmt.Errorf("cluster.secretFile %s: %w", c.SecretFile, err)
	}
	payloads, err := cluster.OpenPayloads(cluster.PayloadOptions{Dir: filepath.Join(cfg.DataDir, "payloads"), Signer: signer,
		Log: log.With().Str("source", "payloads").Logger()})
	if err != nil {
		return openedStore{}, err
	}
	tlsFiles := etcd.TLSFiles(c.Etcd.TLS)
	var clientTLS *tls.Config
	if tlsFiles != (etcd.TLSFiles{}) {
		if clientTLS, err = etcd.ClientTLS(tlsFiles); err != nil {
			return openedStore{}, fmt.Errorf("cluster.etcd.tls: %w", err)
		}
	}
	var o openedStore
	endpoints := c.Etcd.Endpoints
	if e := c.Etcd.Embed; e != nil {
		m, err := etcd.StartMember(etcd.MemberConfig{
			Name: c.Name, DataDir: cfg.EtcdDataDir(),
			PeerURL: e.PeerURL, ClientURL: e.ClientURL,
			InitialCluster: e.InitialCluster, Join: e.Join,
			ClientTLS: tlsFiles, PeerTLS: etcd.TLSFiles(e.PeerTLS),
			Log: etcdLog{log.With().Str("source", "etcd").Logger()},
		})
		if err != nil {
			return openedStore{}, err
		}
		o.member = m
		endpoints = m.Endpoints() // a learner's node talks to the voters
	}
	st, err := etcd.Open(etcd.Options{Endpoints: endpoints, TLS: clientTLS, Prefix: c.Etcd.Prefix, Node: c.Name,
		DialTimeout: c.Etcd.DialTimeout, Payloads: payloads})
	if err != nil {
		if o.member != nil {
			o.member.Close()
		}
		return openedStore{}, err
	}
	o.daemonStore, o.etcd, o.signer, o.payloads = st, st, signer, payloads
	log.Info().Str("node", c.Name).Strs("etcd", endpoints).Bool("member", o.member != nil).
		Msg("cluster mode: records in etcd")
	if open := plainEtcd(c); open != "" {
		log.Warn().Str("url", open).
			Msg("etcd is reached without certificates: any process that can connect (another local user, a model with network: host) reads every record and writes its own; make certificates with `inferd cluster init` (docs/cluster.md, \"etcd is inferd's alone\")")
	}
	if u, err := url.Parse(cfg.AdvertiseURL()); err == nil {
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
			log.Warn().Str("advertise", cfg.AdvertiseURL()).
				Msg("cluster.advertise is a loopback address: only nodes on this machine can reach this node; set the address other boxes use")
		}
	}
	return o, nil
}

// plainEtcd returns the first etcd URL of c that takes no client
// certificate (plain http, or https without a CA the member checks
// clients against), or "" when etcd answers only holders of the cluster's
// certificate.
func plainEtcd(c *config.Cluster) string {
	urls := c.Etcd.Endpoints
	if e := c.Etcd.Embed; e != nil {
		urls = []string{e.ClientURL}
	}
	for _, u := range urls {
		if strings.HasPrefix(u, "http://") || (c.Etcd.Embed != nil && c.Etcd.TLS.CAFile == "") {
			return u
		}
	}
	return ""
}

// etcdLog passes the etcd member's error lines (JSON from its zap logger)
// to the daemon's log.
type etcdLog struct{ log zerolog.Logger }

func (l etcdLog) Write(p []byte) (int, error) {
	l.log.Error().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// clusterMode is what a node of a cluster runs beside the single box's
// pieces: its membership (cluster.Node: lease, node key, leader election),
// the router of starts to the nodes a project is placed on, and the
// payloads held on this node. Nil on a single box.
type clusterMode struct {
	node     *cluster.Node
	router   *cluster.Router
	signer   *cluster.Signer
	payloads *cluster.PayloadStore
	refs     cluster.PayloadRefs
	callNode func(id string) (string, error)
	sched    func() schedulerHooks
	capacity func() backend.Capacity
	// bound is closed once the node's first session has bound the
	// store's call writes to its lease: the scheduler starts after it, so
	// that every call it writes is fenced.
	bound chan struct{}
	// sessions gets each new session's lease when nobody holds the last
	// one unread (a send never blocks): for a waiter on a rejoin.
	sessions chan clientv3.LeaseID
}

// schedulerHooks is what the node's membership drives in the scheduler.
type schedulerHooks interface {
	Adopt(c store.Call)
	Abandon()
	ProjectChanged(id string)
	TeamShareChanged(id string)
	Snapshot() scheduler.Status
	FitsNow(m store.ModelSpec) bool // the scheduler's fit rule, for a project with no placement
}

// newClusterMode creates this node's membership over the etcd store: each
// session binds the store's call writes to its lease, a lapsed lease
// abandons the scheduler's live calls, calls the leader hands here are
// adopted, and a placement change makes the scheduler read the project's
// share again and wakes the starts waiting for a placement. sched is set
// before the node runs; capacity is the replica backend's. Returns nil,
// nil on a single box.
func newClusterMode(cfg config.Config, o openedStore, sched func() schedulerHooks,
	capacity func() backend.Capacity, log zerolog.Logger) (*clusterMode, error) {
	if cfg.Cluster == nil {
		return nil, nil
	}
	st := o.etcd
	m := &clusterMode{signer: o.signer, payloads: o.payloads, refs: st, callNode: st.CallNode,
		sched: sched, capacity: capacity,
		bound: make(chan struct{}), sessions: make(chan clientv3.LeaseID, 1)}
	var once sync.Once
	var err error
	m.node, err = cluster.New(cluster.Options{
		Client: st.Client(), Prefix: st.Prefix(),
		Name: cfg.Cluster.Name, Advertise: cfg.AdvertiseURL(), Member: o.member != nil,
		Load: func() (cluster.Capacity, map[string]cluster.ProjectLoad) {
			return nodeLoad(sched().Snapshot(), capacity())
		},
		Teams:       func() map[string]cluster.TeamLoad { return teamLoads(sched().Snapshot().Teams) },
		OnTeamShare: func(team string) { sched().TeamShareChanged(team) },
		OnSession: func(key string, lease clientv3.LeaseID) {
			st.BindLease(key, lease)
			once.Do(func() { close(m.bound) })
			select {
			case m.sessions <- lease:
			default:
			}
		},
		OnFenced: func() { sched().Abandon() },
		Adopt: func(id string) error {
			c, err := st.Adopt(id)
			switch {
			case errors.Is(err, store.ErrUnavailable):
				return err // tried again: the call is this node's
			case err != nil:
				log.Warn().Err(err).Str("call", id).Msg("a call handed to this node could not be adopted")
				return nil
			}
			sched().Adopt(c)
			return nil
		},
		OnPlacement: func(project string) {
			sched().ProjectChanged(project)
			m.router.PlacementChanged(project)
		},
		Store: st,
		Log:   log,
	})
	if err != nil {
		return nil, err
	}
	m.router = cluster.NewRouter(m.node)
	if m.payloads != nil {
		m.payloads.SetPeers(m.node)
	}
	return m, nil
}

// teamLoads is what a node publishes of the teams whose quotas the leader
// leases to nodes (cluster.TeamLoad): each one's share in force, with the
// revision of the record it came from, its use and its want, all from one
// snapshot of the scheduler.
func teamLoads(teams []scheduler.TeamStatus) map[string]cluster.TeamLoad {
	var out map[string]cluster.TeamLoad
	for _, t := range teams {
		q := t.Quota
		if t.Share == nil || t.Want == nil || q.RunningCalls == 0 && q.Replicas == 0 && q.GPUs == 0 && q.CPUSlots == 0 {
			continue
		}
		if out == nil {
			out = map[string]cluster.TeamLoad{}
		}
		out[t.ID] = cluster.TeamLoad{Rev: t.ShareRev, Share: *t.Share, Want: *t.Want,
			Use: store.Quota{RunningCalls: t.RunningCalls, Replicas: t.Replicas, GPUs: t.GPUs, CPUSlots: t.CPUSlots}}
	}
	return out
}

// share is the scheduler's Config.Share in cluster mode: this node's part
// of the project's replicas in the leader's placement; ok false when the
// project has no placement yet or is placed on other nodes only.
func (m *clusterMode) share(project string) (lo, hi int, ok bool) {
	p, ok := m.node.Placement(project)
	if !ok {
		return 0, 0, false
	}
	s, ok := p.Nodes[m.node.Name()]
	return s.Min, s.Max, ok
}

// routing is the public API's cluster routing (httpapi.Options.Routing):
// starts and cancels forwarded to the nodes that run them, and the signed
// payload API of this node under /cluster/v1/.
func (m *clusterMode) routing() *httpapi.Routing {
	r := &httpapi.Routing{Router: m.router, Signer: m.signer, CallNode: m.callNode, Nodes: m.node.Nodes,
		Fits: func(p store.Project) bool { return m.sched().FitsNow(p.Model) }}
	if m.payloads != nil {
		const payload = "payloads/:id/:kind"
		r.Handle(http.MethodGet, payload, m.payloads)
		r.Handle(http.MethodPut, payload, m.payloads)
		r.Handle(http.MethodDelete, "payloads/:id", m.payloads)
	}
	return r
}

// adminCancel is the admin API's cancel: the scheduler's own, and in
// cluster mode (routing set) a call pending on another node is cancelled
// by that node (httpapi.Routing.Canceller), which alone runs it.
func adminCancel(local admin.CallCanceller, routing *httpapi.Routing) admin.CallCanceller {
	if routing == nil {
		return local
	}
	return routing.Canceller(local)
}

// nodeLoad is what a node publishes of itself (cluster.NodeInfo): its
// GPUs with the memory the scheduler could still place on each (the
// smaller of what the driver reports free and what the scheduler has not
// handed out), its CPU slots, and the load of each project with replicas
// or calls here.
func nodeLoad(st scheduler.Status, capa backend.Capacity) (cluster.Capacity, map[string]cluster.ProjectLoad) {
	reserved := map[string]scheduler.GPUStatus{}
	for _, g := range st.GPUs {
		reserved[g.UUID] = g
	}
	out := cluster.Capacity{CPUSlots: capa.CPUSlots, CPUUsed: st.CPUSlotsUsed}
	for _, d := range capa.GPUs {
		usable := d.UsableMiB()
		g := reserved[d.UUID]
		free := min(d.MemoryFreeMiB, usable-min(g.ReservedMiB, usable))
		out.GPUs = append(out.GPUs, cluster.GPUInfo{
			Index: d.Index, UUID: d.UUID, Name: d.Name,
			TotalMiB: int64(d.MemoryTotalMiB), FreeMiB: int64(free),
			Healthy: d.Healthy(), InUse: g.ReservedMiB > 0 && g.ReservedMiB >= usable,
		})
	}
	var loads map[string]cluster.ProjectLoad
	for _, p := range st.Projects {
		l := cluster.ProjectLoad{Busy: p.Running, Queued: p.Queued, Max: p.NodeMaxReplicas}
		for _, r := range p.Replicas {
			switch r.State {
			case scheduler.ReplicaStopping:
				continue
			case scheduler.ReplicaReady, scheduler.ReplicaBusy:
				l.Ready++
			}
			l.Replicas++
		}
		if l.Replicas == 0 && l.Busy == 0 && l.Queued == 0 {
			continue
		}
		if loads == nil {
			loads = map[string]cluster.ProjectLoad{}
		}
		loads[p.ID] = l
	}
	return out, loads
}

// batchNode is the node name the Batch API's ids carry (batches.Holder):
// this node's in cluster mode, none on a box (m nil).
func batchNode(m *clusterMode) string {
	if m == nil {
		return ""
	}
	return m.node.Name()
}
