package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/cluster"
	"inferd/config"
	"inferd/gpu"
	"inferd/internal/testenv"
	"inferd/scheduler"
	"inferd/scheduler/backend"
	"inferd/store"
	"inferd/store/etcd"
)

// A node publishes, per GPU, the memory its scheduler could still place
// there (the smaller of the driver's free figure and what the scheduler
// has not handed out), whether a whole-GPU replica holds it, its CPU
// slots, and the load of the projects it has replicas or calls of.
func TestNodeLoadIsWhatTheSchedulerCouldStillPlace(t *testing.T) {
	capa := backend.Capacity{CPUSlots: 4, GPUs: []gpu.Device{
		{Index: 0, UUID: "GPU-a", Name: "sim", MemoryTotalMiB: 16000, MemoryFreeMiB: 16000},
		{Index: 1, UUID: "GPU-b", Name: "sim", MemoryTotalMiB: 16000, MemoryFreeMiB: 9000},
		{Index: 2, UUID: "GPU-c", Name: "sim", MemoryTotalMiB: 16000, MemoryFreeMiB: 0},
		{Index: 3, UUID: "GPU-d", Name: "sim", MemoryTotalMiB: 16000, MemoryFreeMiB: 16000, Problem: "lost"},
	}}
	st := scheduler.Status{
		CPUSlots: 4, CPUSlotsUsed: 1,
		GPUs: []scheduler.GPUStatus{
			{UUID: "GPU-a", ReservedMiB: 4000, Replicas: []string{"p-1"}},  // packed: 12000 not handed out
			{UUID: "GPU-b", ReservedMiB: 2000, Replicas: []string{"p-2"}},  // the driver's 9000 is less
			{UUID: "GPU-c", ReservedMiB: 16000, Replicas: []string{"q-1"}}, // a whole-GPU replica
			{UUID: "GPU-d", Replicas: []string{}},
		},
		Projects: []scheduler.ProjectStatus{
			{ID: "p", Queued: 3, Running: 2, NodeMaxReplicas: 2, Replicas: []scheduler.ReplicaStatus{
				{State: "busy"}, {State: "ready"}, {State: "booting"}, {State: "stopping"}}},
			{ID: "idle", Replicas: []scheduler.ReplicaStatus{}},
			{ID: "q", Queued: 1, NodeMaxReplicas: 1},
		},
	}
	gotCap, gotLoads := nodeLoad(st, capa)
	wantCap := cluster.Capacity{CPUSlots: 4, CPUUsed: 1, GPUs: []cluster.GPUInfo{
		{Index: 0, UUID: "GPU-a", Name: "sim", TotalMiB: 16000, FreeMiB: 12000, Healthy: true},
		{Index: 1, UUID: "GPU-b", Name: "sim", TotalMiB: 16000, FreeMiB: 9000, Healthy: true},
		{Index: 2, UUID: "GPU-c", Name: "sim", TotalMiB: 16000, FreeMiB: 0, Healthy: true, InUse: true},
		{Index: 3, UUID: "GPU-d", Name: "sim", TotalMiB: 16000, FreeMiB: 16000, Healthy: false},
	}}
	if !reflect.DeepEqual(gotCap, wantCap) {
		t.Errorf("capacity =\n%+v\nwant\n%+v", gotCap, wantCap)
	}
	wantLoads := map[string]cluster.ProjectLoad{
		"p": {Replicas: 3, Ready: 2, Busy: 2, Queued: 3, Max: 2},
		"q": {Queued: 1, Max: 1},
	}
	if !reflect.DeepEqual(gotLoads, wantLoads) {
		t.Errorf("loads = %+v, want %+v", gotLoads, wantLoads)
	}
}

// hooks is a scheduler as the node drives it: it records what it is told.
type hooks struct {
	abandons chan struct{}
	adopted  chan store.Call
}

func (h *hooks) Adopt(c store.Call)           { h.adopted <- c }
func (h *hooks) Abandon()                     { h.abandons <- struct{}{} }
func (h *hooks) ProjectChanged(string)        {}
func (h *hooks) TeamShareChanged(string)      {}
func (h *hooks) Snapshot() scheduler.Status   { return scheduler.Status{} }
func (h *hooks) FitsNow(store.ModelSpec) bool { return false }

// The node's wiring on a real etcd: its session binds the store's call
// writes to its lease; when the lease goes (revoked here, as a cut-off
// node's lapses), the scheduler abandons its calls, the calls taken under
// the old lease can no longer be written, and the node rejoins under a new
// lease that new calls write under; a call the leader hands to the node
// reaches the scheduler adopted.
func TestClusterNodeFencesTheStoreAndDrivesTheScheduler(t *testing.T) {
	m, err := etcd.StartMember(etcd.MemberConfig{Name: "n1", DataDir: t.TempDir(),
		PeerURL: "http://" + testenv.FreeAddr(t), ClientURL: "http://" + testenv.FreeAddr(t),
		HeartbeatMs: 10, ElectionMs: 100, StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st, err := etcd.Open(etcd.Options{Endpoints: m.ClientURLs(), Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("s", cluster.MinSecretBytes)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{Listen: "127.0.0.1:1", Cluster: &config.Cluster{Name: "n1", SecretFile: secret}}
	h := &hooks{abandons: make(chan struct{}, 4), adopted: make(chan store.Call, 4)}
	cm, err := newClusterMode(cfg, openedStore{daemonStore: st, etcd: st}, func() schedulerHooks { return h },
		func() backend.Capacity { return backend.Capacity{CPUSlots: 1} }, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- cm.node.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("node Run: %v", err)
		}
	}()
	within := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: not within 20s", what)
		}
	}
	within("first session", cm.bound)
	first := <-cm.sessions

	bg := context.Background()
	if err := st.SaveCall(bg, store.Call{ID: "call_old", ProjectID: "p", State: store.CallQueued}); err != nil {
		t.Fatal(err)
	}
	key := st.Prefix() + cluster.NodesPrefix + "n1"
	resp, err := st.Client().Get(bg, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("node key: %v, %v", resp, err)
	}
	old := clientv3.LeaseID(resp.Kvs[0].Lease)
	if old != first {
		t.Fatalf("node key under lease %x, the session's is %x", old, first)
	}
	if _, err := st.Client().Revoke(bg, old); err != nil {
		t.Fatal(err)
	}
	within("Abandon after the lease went", h.abandons)
	select {
	case l := <-cm.sessions:
		if l == old {
			t.Fatalf("rejoined under the revoked lease %x", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no rejoin within 20s")
	}

	err = st.SaveCall(bg, store.Call{ID: "call_old", ProjectID: "p", State: store.CallSucceeded, Message: "success"})
	if !errors.Is(err, store.ErrFenced) {
		t.Errorf("late result of a call taken under the lapsed lease = %v, want ErrFenced", err)
	}
	if err := st.SaveCall(bg, store.Call{ID: "call_new", ProjectID: "p", State: store.CallQueued}); err != nil {
		t.Errorf("a new call after the rejoin = %v", err)
	}

	// The leader hands a call to this node: its pending entry names the
	// node (written here by a store of no lease, standing for the
	// leader's HandOver) and an assign key tells the node. It reaches the
	// scheduler adopted, and its writes go under the node's lease.
	leader, err := etcd.Open(etcd.Options{Endpoints: m.ClientURLs(), Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()
	if err := leader.SaveCall(bg, store.Call{ID: "call_handed", ProjectID: "p", State: store.CallQueued, Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Client().Put(bg, st.Prefix()+cluster.AssignPrefix+"n1/call_handed", ""); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-h.adopted:
		if c.ID != "call_handed" || c.State != store.CallQueued || c.Attempt != 1 {
			t.Errorf("adopted %+v, want call_handed as stored", c)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no call adopted within 20s")
	}
	if err := st.SaveCall(bg, store.Call{ID: "call_handed", ProjectID: "p", State: store.CallSucceeded, Message: "success"}); err != nil {
		t.Errorf("the adopted call's result = %v, want it written", err)
	}
}

// A node whose cluster secret is missing, readable by others or short
// does not start, and says why, before it touches etcd.
func TestServeRefusesABadClusterSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "none"), "no such file"},
		{"readable by others", write("open", strings.Repeat("s", 40), 0o644), "chmod 600"},
		{"short", write("short", "tiny", 0o600), "need at least 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Config{DataDir: t.TempDir(), Cluster: &config.Cluster{Name: "n1", SecretFile: tc.path,
				Etcd: config.ClusterEtcd{Endpoints: []string{"http://127.0.0.1:1"}}}}
			_, err := openStore(cfg, zerolog.Nop())
			if err == nil || !strings.Contains(err.Error(), "cluster.secretFile") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("openStore = %v, want a cluster.secretFile error saying %q", err, tc.want)
			}
		})
	}
}

// A node warns at start when its etcd takes no client certificate: a
// plain-http URL, or an embedded member serving https without a CA to
// check clients against. An external https etcd is its operator's to
// configure; with the cluster's CA the member answers nodes alone.
func TestPlainEtcdNamesAURLThatTakesNoCertificate(t *testing.T) {
	files := config.TLSFiles{CertFile: "node.pem", KeyFile: "node-key.pem", CAFile: "ca.pem"}
	for _, tc := range []struct {
		name string
		etcd config.ClusterEtcd
		want string
	}{
		{"embedded, plain http", config.ClusterEtcd{Embed: &config.EtcdEmbed{ClientURL: "http://10.0.0.1:2379"}}, "http://10.0.0.1:2379"},
		{"embedded, https without a CA", config.ClusterEtcd{Embed: &config.EtcdEmbed{ClientURL: "https://10.0.0.1:2379"},
			TLS: config.TLSFiles{CertFile: "node.pem", KeyFile: "node-key.pem"}}, "https://10.0.0.1:2379"},
		{"embedded, cluster init's files", config.ClusterEtcd{Embed: &config.EtcdEmbed{ClientURL: "https://10.0.0.1:2379"}, TLS: files}, ""},
		{"external, one plain endpoint", config.ClusterEtcd{Endpoints: []string{"https://a:2379", "http://b:2379"}, TLS: files}, "http://b:2379"},
		{"external, https", config.ClusterEtcd{Endpoints: []string{"https://a:2379"}, TLS: files}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := plainEtcd(&config.Cluster{Etcd: tc.etcd}); got != tc.want {
				t.Errorf("plainEtcd = %q; want %q", got, tc.want)
			}
		})
	}
}
