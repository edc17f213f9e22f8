package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/cluster"
	"inferd/config"
	"inferd/internal/testenv"
	"inferd/internal/testpki"
	"inferd/store"
	"inferd/store/bolt"
	"inferd/store/etcd"
	"inferd/store/storetest"
)

// testMember is an embedded etcd member on free loopback ports, with test
// raft timing.
type testMember struct {
	*etcd.Member
	name, peerURL, clientURL, dir string
}

func startTestMember(t *testing.T, name, dir, peerURL, initialCluster string, join bool) *testMember {
	t.Helper()
	if peerURL == "" {
		peerURL = "http://" + testenv.FreeAddr(t)
	}
	m, err := startMemberOf(name, dir, peerURL, initialCluster, join)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// startMemberOf starts a member, from a goroutine too (no t.Fatal); the
// caller closes it. startTestMember closes it when the test ends.
func startMemberOf(name, dir, peerURL, initialCluster string, join bool) (*testMember, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	clientURL := "http://" + ln.Addr().String()
	ln.Close()
	m, err := etcd.StartMember(etcd.MemberConfig{
		Name: name, DataDir: dir, PeerURL: peerURL, ClientURL: clientURL, InitialCluster: initialCluster, Join: join,
		HeartbeatMs: 10, ElectionMs: 100, StartTimeout: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	return &testMember{Member: m, name: name, peerURL: peerURL, clientURL: clientURL, dir: dir}, nil
}

// clusterConfigFile writes a node's config that reaches etcd at endpoints.
func clusterConfigFile(t *testing.T, name string, endpoints ...string) string {
	t.Helper()
	dir := t.TempDir()
	body := fmt.Sprintf("dataDir: %s\nlisten: 127.0.0.1:8080\ncluster:\n  name: %s\n  secretFile: %s\n  etcd:\n    endpoints: [%s]\n",
		filepath.Join(dir, "data"), name, filepath.Join(dir, "secret"), strings.Join(endpoints, ", "))
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func openTestStore(t *testing.T, node string, endpoints ...string) *etcd.Store {
	t.Helper()
	s, err := etcd.Open(etcd.Options{Endpoints: endpoints, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// status shows the members with their health and leader, etcd's and
// inferd's leaders and the live nodes with their capacity.
func TestClusterStatusShowsMembersLeadersAndNodes(t *testing.T) {
	m := startTestMember(t, "box-1", t.TempDir(), "", "", false)
	cfg := clusterConfigFile(t, "box-1", m.clientURL)
	s := openTestStore(t, "box-1", m.clientURL)

	// What the membership and election of two nodes put in etcd.
	cli := s.Client()
	ctx := context.Background()
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []cluster.NodeInfo{
		{Name: "box-1", Advertise: "http://10.0.0.1:8080", Member: true,
			Capacity: cluster.Capacity{CPUSlots: 8, CPUUsed: 1, GPUs: []cluster.GPUInfo{{Index: 0, TotalMiB: 24000, FreeMiB: 23000, Healthy: true}}}},
		{Name: "box-4", Advertise: "http://10.0.0.4:8080", Capacity: cluster.Capacity{CPUSlots: 4}},
	} {
		b, _ := json.Marshal(n)
		if _, err := cli.Put(ctx, s.Prefix()+cluster.NodesPrefix+n.Name, string(b), clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	// Two candidates: the oldest key leads.
	for _, n := range []string{"box-4", "box-1"} {
		if _, err := cli.Put(ctx, fmt.Sprintf("%s%s%x-%s", s.Prefix(), cluster.ElectionPrefix, lease.ID, n), n, clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}

	r := runCLI(t, nil, "--config", cfg, "cluster", "status")
	if r.code != 0 {
		t.Fatalf("cluster status: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		`(?m)^box-1\s+[0-9a-f]+\s+voter, leader\s+healthy\s+` + regexp.QuoteMeta(m.peerURL+"  "+m.clientURL),
		`quorum: yes \(1 of 1 voters healthy; writes need 1\)`,
		`etcd leader: box-1`,
		`inferd leader: box-4`,
		`inferd nodes: 2 live`,
		`(?m)^box-1\s+http://10.0.0.1:8080\s+yes\s+0:23000/24000\s+1/8\s`,
		`(?m)^box-4\s+http://10.0.0.4:8080\s+no\s+none\s+0/4\s`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("status output lacks %s:\n%s", want, r.stdout)
		}
	}
}

// A nodes/ record that does not decode (a node of another release, or a
// hand-made key) hides no other node: status lists every node that
// decodes, names the bad record, and exits 1 so a monitoring check sees it.
func TestClusterStatusNamesABadNodeRecordAndFails(t *testing.T) {
	m := startTestMember(t, "box-1", t.TempDir(), "", "", false)
	cfg := clusterConfigFile(t, "box-1", m.clientURL)
	s := openTestStore(t, "box-1", m.clientURL)
	ctx := context.Background()
	good, _ := json.Marshal(cluster.NodeInfo{Name: "box-2", Advertise: "http://10.0.0.2:8080", Capacity: cluster.Capacity{CPUSlots: 4}})
	for key, v := range map[string]string{"box-1": `{"name":`, "box-2": string(good), "box-3": `[1,2]`} {
		if _, err := s.Client().Put(ctx, s.Prefix()+cluster.NodesPrefix+key, v); err != nil {
			t.Fatal(err)
		}
	}
	r := runCLI(t, nil, "--config", cfg, "cluster", "status")
	if r.code != 1 {
		t.Errorf("cluster status with bad node records: exit %d; want 1\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		`inferd nodes: 1 live`,
		`(?m)^box-2\s+http://10.0.0.2:8080\s+no\s+none\s+0/4\s`,
		`bad node record: /inferd/nodes/box-1 does not decode: `,
		`bad node record: /inferd/nodes/box-3 does not decode: `,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("status output lacks %s:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "2 node record(s)") {
		t.Errorf("stderr %q does not say why status failed", r.stderr)
	}
}

// Unreachable etcd: status fails within its bounds, with exit 1.
func TestClusterStatusFailsWhenEtcdIsUnreachable(t *testing.T) {
	cfg := clusterConfigFile(t, "box-1", "http://"+testenv.FreeAddr(t))
	r := runCLI(t, nil, "--config", cfg, "cluster", "status")
	if r.code != 1 || !strings.Contains(r.stderr, "cluster unreachable: no etcd member answers") {
		t.Errorf("status against no etcd: exit %d; want 1 saying so\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	// The other verbs say the same: where they looked, and --endpoints.
	for _, args := range [][]string{{"members"}, {"add-member", "box-2", "http://127.0.0.1:2380"}, {"promote-member", "box-2"}, {"remove-member", "box-2"}} {
		r := runCLI(t, nil, append([]string{"--config", cfg, "cluster"}, args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "no etcd member answers at http://") || !strings.Contains(r.stderr, "--endpoints") {
			t.Errorf("cluster %v against no etcd: exit %d, stderr %q; want 1 naming the URL and --endpoints", args, r.code, r.stderr)
		}
	}
	r = runCLI(t, nil, "--data-dir", t.TempDir(), "cluster", "status")
	if r.code != 1 || !strings.Contains(r.stderr, "no cluster: section") {
		t.Errorf("status without a cluster config: exit %d, stderr %q", r.code, r.stderr)
	}
}

// The membership round: the last voter cannot be removed; a learner added
// with add-member joins with the config it prints and is promoted; a
// learner that never started is removed; one of two voters down takes
// quorum away, which status reports with exit 1.
func TestClusterMembershipChanges(t *testing.T) {
	m1 := startTestMember(t, "box-1", t.TempDir(), "", "", false)
	cfg := clusterConfigFile(t, "box-1", m1.clientURL)

	r := runCLI(t, nil, "--config", cfg, "cluster", "remove-member", "box-1")
	if r.code != 1 || !strings.Contains(r.stderr, "the last voter") {
		t.Fatalf("remove of the last voter: exit %d, stderr %q; want refused", r.code, r.stderr)
	}
	for _, args := range [][]string{{"add-member", "Box_2", "http://127.0.0.1:1"}, {"add-member", "box-2", "127.0.0.1:1"}, {"add-member", "box-2"}} {
		if r := runCLI(t, nil, append([]string{"--config", cfg, "cluster"}, args...)...); r.code != 2 {
			t.Errorf("cluster %v: exit %d; want 2 (usage)", args, r.code)
		}
	}

	// A learner that never started is removed by its id.
	r = runCLI(t, nil, "--config", cfg, "cluster", "add-member", "box-3", "http://"+testenv.FreeAddr(t), "--learner")
	if r.code != 0 {
		t.Fatalf("add-member box-3: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	id := regexp.MustCompile(`box-3 \(id ([0-9a-f]+)\)`).FindStringSubmatch(r.stdout)
	if id == nil {
		t.Fatalf("add-member names no id:\n%s", r.stdout)
	}
	r = runCLI(t, nil, "--config", cfg, "cluster", "remove-member", id[1])
	if r.code != 0 || !strings.Contains(r.stdout, "has 1 voters; writes need 1") {
		t.Errorf("remove-member %s: exit %d\n%s\n%s", id[1], r.code, r.stdout, r.stderr)
	}

	peer2 := "http://" + testenv.FreeAddr(t)
	r = runCLI(t, nil, "--config", cfg, "cluster", "add-member", "box-2", peer2, "--learner")
	if r.code != 0 {
		t.Fatalf("add-member --learner: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	wantInitial := "box-1=" + m1.peerURL + ",box-2=" + peer2
	for _, want := range []string{"as a learner", "name: box-2", "peerURL: " + peer2, "initialCluster: " + wantInitial, "join: true", "promote-member box-2"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("add-member output lacks %q:\n%s", want, r.stdout)
		}
	}
	// The printed section is one a node listening on every address starts
	// with, as the walkthrough's do.
	section := r.stdout[strings.Index(r.stdout, "cluster:\n"):]
	section = section[:strings.Index(section, "\n\n")]
	printed := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(printed, []byte("listen: 0.0.0.0:8080\n"+section+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(printed, nil, nil); err != nil {
		t.Errorf("the cluster: section add-member printed does not load: %v\n%s", err, section)
	}
	if r := runCLI(t, nil, "--config", cfg, "cluster", "add-member", "box-2", "http://"+testenv.FreeAddr(t)); r.code != 1 {
		t.Errorf("adding box-2 twice: exit %d; want 1", r.code)
	}

	// The new node starts with what add-member printed.
	m2 := startTestMember(t, "box-2", t.TempDir(), peer2, wantInitial, true)
	r = runCLI(t, nil, "--config", cfg, "cluster", "promote-member", "box-2")
	if r.code != 0 || !strings.Contains(r.stdout, "has 2 voters; writes need 2") || !strings.Contains(r.stdout, "run 1, 3 or 5") {
		t.Fatalf("promote-member: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, nil, "--config", cfg, "cluster", "members")
	if r.code != 0 || !regexp.MustCompile(`(?m)^box-2\s+[0-9a-f]+\s+voter\s+healthy`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "2 voters, 0 learners") {
		t.Errorf("members after the promotion: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, nil, "--config", cfg, "cluster", "status")
	if r.code != 0 || !strings.Contains(r.stdout, "quorum: yes (2 of 2 voters healthy; writes need 2)") {
		t.Errorf("status with two voters: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// One of two voters down: no quorum, exit 1.
	m2.Close()
	r = runCLI(t, nil, "--config", cfg, "cluster", "status")
	if r.code != 1 || !strings.Contains(r.stdout, "quorum: NO (") ||
		!regexp.MustCompile(`(?m)^box-2 .*unreachable`).MatchString(r.stdout) || !strings.Contains(r.stderr, "no quorum") {
		t.Errorf("status without quorum: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// seedRecords writes a team, a key, a project and a finished call through
// s, and returns the key's secret and the call.
func seedRecords(t *testing.T, s store.Store) (string, store.Call) {
	t.Helper()
	secret, _, err := s.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutProject(storetest.Project("echo", "acme")); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	c := store.Call{ID: "call_01900000-0000-7000-8000-000000000001", ProjectID: "echo", TeamID: "acme",
		State: store.CallSucceeded, Message: "success", Inputs: json.RawMessage(`{"x":1}`), Outputs: json.RawMessage(`{"y":2}`),
		Created: now, Finished: now}
	if err := s.SaveCall(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return secret, c
}

// checkRecords checks that s holds what seedRecords wrote.
func checkRecords(t *testing.T, s store.Store, secret string, c store.Call) {
	t.Helper()
	if k, err := s.Authenticate(secret); err != nil || k.TeamID != "acme" {
		t.Errorf("Authenticate = %+v, %v; want the key of acme", k, err)
	}
	if p, err := s.ProjectByModelKey("key-echo"); err != nil || p.ID != "echo" || p.TeamID != "acme" {
		t.Errorf("ProjectByModelKey = %+v, %v; want project echo", p, err)
	}
	got, err := s.GetCall(c.ID)
	if err != nil || got.State != c.State || string(got.Inputs) != string(c.Inputs) || string(got.Outputs) != string(c.Outputs) {
		t.Errorf("GetCall = %+v, %v; want %+v", got, err, c)
	}
}

// A backup restored into a new data directory: a member started on it
// holds the records; a damaged backup and an existing directory are refused.
func TestClusterBackupThenRestoreIntoANewMember(t *testing.T) {
	m := startTestMember(t, "box-1", t.TempDir(), "", "", false)
	cfg := clusterConfigFile(t, "box-1", m.clientURL)
	s := openTestStore(t, "box-1", m.clientURL)
	secret, call := seedRecords(t, s)

	file := filepath.Join(t.TempDir(), "cluster.snap")
	r := runCLI(t, nil, "--config", cfg, "cluster", "backup", file)
	if r.code != 0 || !strings.Contains(r.stdout, "cluster backup written to "+file) {
		t.Fatalf("cluster backup: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, nil, "--config", cfg, "cluster", "backup", file); r.code != 1 || !strings.Contains(r.stderr, "--force") {
		t.Errorf("backup over an existing file: exit %d, stderr %q; want refused", r.code, r.stderr)
	}
	if _, err := os.Stat(file + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("backup left its temporary file (stat: %v)", err)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v, %v; want mode 600 (it holds the webhook secrets)", fi, err)
	}
	// Records written after the backup are not in it.
	if _, _, err := s.CreateKey("later", store.ScopeTeam); err != nil {
		t.Fatal(err)
	}

	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	damaged := filepath.Join(t.TempDir(), "damaged.snap")
	if err := os.WriteFile(damaged, raw[:len(raw)-100], 0o600); err != nil {
		t.Fatal(err)
	}
	list, err := s.Client().MemberList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	oldCluster := list.Header.ClusterId
	// The member is made again under its own name and peer URL, as after
	// losing the box.
	newDir := filepath.Join(t.TempDir(), "etcd")
	restore := func(src, dir string) result {
		return runCLI(t, nil, "cluster", "restore", src, "--data-dir", dir, "--name", "box-1", "--initial-cluster", "box-1="+m.peerURL)
	}
	if r := restore(damaged, newDir); r.code != 1 || !strings.Contains(r.stderr, "refusing to restore") {
		t.Errorf("restore of a damaged backup: exit %d, stderr %q; want refused", r.code, r.stderr)
	}
	if r := restore(file, m.dir); r.code != 1 || !strings.Contains(r.stderr, "exists") {
		t.Errorf("restore over a member's directory: exit %d, stderr %q; want refused", r.code, r.stderr)
	}
	if r := restore(file, newDir); r.code != 0 || !strings.Contains(r.stdout, "restored "+file+" into "+newDir) {
		t.Fatalf("cluster restore: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	s.Close()
	m.Close()
	restored := startTestMember(t, "box-1", newDir, m.peerURL, "box-1="+m.peerURL, false)
	s2 := openTestStore(t, "box-1", restored.clientURL)
	checkRecords(t, s2, secret, call)
	list, err = s2.Client().MemberList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if list.Header.ClusterId == oldCluster {
		t.Errorf("restored cluster id %x is the backed-up cluster's: a member of that one could join it", oldCluster)
	}
	if teams, err := s2.ListTeams(); err != nil || len(teams) != 1 {
		t.Errorf("restored teams = %+v, %v; want acme alone (later came after the backup)", teams, err)
	}
}

// import copies a single box's data file into the cluster: teams with
// quotas and secrets, keys that authenticate, projects, unexpired calls
// (the pending ones on this node); run again it writes nothing; a cluster
// with other records is refused unless --force.
func TestClusterImportCopiesASingleBox(t *testing.T) {
	boltPath := filepath.Join(t.TempDir(), "inferd.db")
	b, err := bolt.Open(boltPath, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	secret, final := seedRecords(t, b)
	quota := store.Quota{Replicas: 4, QueuedCalls: 100}
	if _, err := b.SetTeamQuota("acme", quota); err != nil {
		t.Fatal(err)
	}
	whsec, err := b.WebhookSecret("acme", false)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour).UTC()
	queued := store.Call{ID: "call_01900000-0000-7000-8000-000000000002", ProjectID: "echo", TeamID: "acme",
		State: store.CallQueued, Inputs: json.RawMessage(`{"q":1}`), Created: time.Now().UTC()}
	expired := store.Call{ID: "call_01900000-0000-7000-8000-000000000000", ProjectID: "echo", TeamID: "acme",
		State: store.CallSucceeded, Message: "success", Created: old, Finished: old}
	for _, c := range []store.Call{queued, expired} {
		if err := b.SaveCall(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	m := startTestMember(t, "box-1", t.TempDir(), "", "", false)
	cfg := clusterConfigFile(t, "box-1", m.clientURL)
	// The box's daemon still has the file open: refused.
	r := runCLI(t, nil, "--config", cfg, "cluster", "import", boltPath)
	if r.code != 1 || !strings.Contains(r.stderr, "in use") {
		t.Errorf("import of a file in use: exit %d, stderr %q; want refused", r.code, r.stderr)
	}
	b.Close()

	r = runCLI(t, nil, "--config", cfg, "cluster", "import", boltPath)
	if r.code != 0 {
		t.Fatalf("cluster import: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{`(?m)^teams\s+1\s+0\s+0$`, `(?m)^keys\s+1\s+0\s+0$`, `(?m)^projects\s+1\s+0\s+0$`,
		`(?m)^calls\s+2\s+0\s+0$`, `1 finished calls older than resultTTL`, `1 calls not finished are pending on node box-1`} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("import output lacks %s:\n%s", want, r.stdout)
		}
	}

	s := openTestStore(t, "box-1", m.clientURL)
	checkRecords(t, s, secret, final)
	if team, err := s.GetTeam("acme"); err != nil || team.Quota != quota {
		t.Errorf("team = %+v, %v; want quota %+v", team, err, quota)
	}
	if got, err := s.WebhookSecret("acme", false); err != nil || got != whsec {
		t.Errorf("webhook secret = %q, %v; want the box's", got, err)
	}
	if _, err := s.GetCall(expired.ID); err == nil {
		t.Errorf("an expired call was imported")
	}
	if ids := callIDs(s.PendingCalls()); len(ids) != 1 || ids[0] != queued.ID {
		t.Errorf("pending calls of box-1 = %v; want %s", ids, queued.ID)
	}
	if in, err := s.CallInputs(queued.ID); err != nil || string(in) != string(queued.Inputs) {
		t.Errorf("queued call's inputs = %s, %v", in, err)
	}

	// Again: nothing written, etcd's revision unchanged.
	rev := func() int64 {
		resp, err := s.Client().Get(context.Background(), "x")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	before := rev()
	r = runCLI(t, nil, "--config", cfg, "cluster", "import", boltPath)
	if r.code != 0 || !regexp.MustCompile(`(?m)^calls\s+0\s+2\s+0$`).MatchString(r.stdout) {
		t.Errorf("second import: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if after := rev(); after != before {
		t.Errorf("second import changed etcd: revision %d → %d", before, after)
	}

	// A record the file lacks: refused, then merged with --force.
	if _, _, err := s.CreateKey("other", store.ScopeTeam); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, "--config", cfg, "cluster", "import", boltPath)
	if r.code != 1 || !strings.Contains(r.stderr, "already holds records the file does not") || !strings.Contains(r.stderr, "team other") {
		t.Errorf("import into a cluster with other records: exit %d, stderr %q; want refused", r.code, r.stderr)
	}
	if r := runCLI(t, nil, "--config", cfg, "cluster", "import", "--force", boltPath); r.code != 0 {
		t.Errorf("import --force: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

func callIDs(calls []store.Call, err error) []string {
	if err != nil {
		return []string{err.Error()}
	}
	var ids []string
	for _, c := range calls {
		ids = append(ids, c.ID)
	}
	return ids
}

// Three voters, one down: quorum holds, status exits 0 and names the
// member that does not answer.
func TestClusterStatusWithOneOfThreeMembersDown(t *testing.T) {
	names := []string{"box-1", "box-2", "box-3"}
	peers := make([]string, len(names))
	var initial []string
	for i, n := range names {
		peers[i] = "http://" + testenv.FreeAddr(t)
		initial = append(initial, n+"="+peers[i])
	}
	// The members of a new cluster wait for each other: start them at once.
	started := make(chan *testMember, len(names))
	for i, n := range names {
		dir := t.TempDir()
		go func() {
			m, err := startMemberOf(n, dir, peers[i], strings.Join(initial, ","), false)
			if err != nil {
				t.Error(err)
			}
			started <- m
		}()
	}
	var ms []*testMember
	for range names {
		if m := <-started; m != nil {
			t.Cleanup(func() { m.Close() })
			ms = append(ms, m)
		}
	}
	if len(ms) != len(names) {
		t.FailNow()
	}
	var down, up *testMember
	for _, m := range ms {
		switch m.name {
		case "box-3":
			down = m
		case "box-1":
			up = m
		}
	}
	down.Close()
	cfg := clusterConfigFile(t, "box-1", up.clientURL)
	r := runCLI(t, nil, "--config", cfg, "cluster", "status")
	if r.code != 0 || !strings.Contains(r.stdout, "quorum: yes (2 of 3 voters healthy; writes need 2)") ||
		!regexp.MustCompile(`(?m)^box-3\s+[0-9a-f]+\s+voter\s+unreachable`).MatchString(r.stdout) {
		t.Errorf("status with one of three down: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// A data file of an older schema is imported through a migrated copy; the
// file itself is left as it was.
func TestClusterImportOfAnOlderSchemaLeavesTheFileAlone(t *testing.T) {
	fixture := filepath.Join("..", "store", "bolt", "testdata", "schema-v1.db")
	raw, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := os.ReadFile(strings.TrimSuffix(fixture, ".db") + ".secret")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "inferd.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	m := startTestMember(t, "box-1", t.TempDir(), "", "", false)
	cfg := clusterConfigFile(t, "box-1", m.clientURL)
	r := runCLI(t, nil, "--config", cfg, "cluster", "import", path)
	if r.code != 0 {
		t.Fatalf("import of a schema-v1 file: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	s := openTestStore(t, "box-1", m.clientURL)
	if k, err := s.Authenticate(strings.TrimSpace(string(secret))); err != nil || k.TeamID != "acme" {
		t.Errorf("Authenticate(the file's key) = %+v, %v", k, err)
	}
	if p, err := s.ProjectByModelKey("key-echo"); err != nil || p.ID != "echo" {
		t.Errorf("ProjectByModelKey = %+v, %v", p, err)
	}
	if ids := callIDs(s.PendingCalls()); len(ids) != 1 {
		t.Errorf("pending calls = %v; want the file's queued call", ids)
	}
	if after, err := os.ReadFile(path); err != nil || string(after) != string(raw) {
		t.Errorf("import changed the file it read (%v)", err)
	}
}

// With mutual TLS on the member's client listener, the cluster commands
// talk to it with the config's cluster.etcd.tls files, status asks each
// member over TLS too, and a config without them is refused by the member.
func TestClusterCommandsOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	files := testpki.Write(t, dir)
	clientURL := "https://" + testenv.FreeAddr(t)
	m, err := etcd.StartMember(etcd.MemberConfig{
		Name: "box-1", DataDir: filepath.Join(dir, "etcd"),
		PeerURL: "http://" + testenv.FreeAddr(t), ClientURL: clientURL,
		ClientTLS: etcd.TLSFiles(files), HeartbeatMs: 10, ElectionMs: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })

	withTLS := clusterConfigFile(t, "box-1", clientURL)
	body, err := os.ReadFile(withTLS)
	if err != nil {
		t.Fatal(err)
	}
	body = append(body, fmt.Sprintf("    tls: {certFile: %s, keyFile: %s, caFile: %s}\n", files.CertFile, files.KeyFile, files.CAFile)...)
	if err := os.WriteFile(withTLS, body, 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "--config", withTLS, "cluster", "status")
	if r.code != 0 || !regexp.MustCompile(`(?m)^box-1\s+[0-9a-f]+\s+voter, leader\s+healthy`).MatchString(r.stdout) {
		t.Errorf("status over TLS: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, nil, "--config", withTLS, "cluster", "backup", filepath.Join(dir, "snap")); r.code != 0 {
		t.Errorf("backup over TLS: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	without := clusterConfigFile(t, "box-1", clientURL)
	if r := runCLI(t, nil, "--config", without, "cluster", "members"); r.code != 1 {
		t.Errorf("members without the TLS files: exit %d; want 1\n%s", r.code, r.stdout)
	}
}

// A mistyped --endpoints is a usage error at once (exit 2, naming the bad
// entry), not a dial that times out and says the cluster is unreachable;
// spaces after the commas are allowed.
func TestClusterEndpointsFlagIsChecked(t *testing.T) {
	cfg := clusterConfigFile(t, "box-1", "http://"+testenv.FreeAddr(t))
	for _, eps := range []string{",,", " ", "notaurl", "http://127.0.0.1:2379,", "127.0.0.1:2379"} {
		r := runCLI(t, nil, "--config", cfg, "cluster", "status", "--endpoints", eps)
		if r.code != 2 || !strings.Contains(r.stderr, "--endpoints") {
			t.Errorf("status --endpoints %q: exit %d, stderr %q; want 2 naming --endpoints", eps, r.code, r.stderr)
		}
	}
	r := runCLI(t, nil, "--config", cfg, "cluster", "status", "--endpoints", "http://"+testenv.FreeAddr(t)+", http://"+testenv.FreeAddr(t))
	if r.code != 1 || !strings.Contains(r.stderr, "cluster unreachable") {
		t.Errorf("status --endpoints with spaces after the comma: exit %d, stderr %q; want the dial tried (1, unreachable)", r.code, r.stderr)
	}
}

// A backup against an etcd that does not answer fails within the request
// bound (exit 1, saying so), and writes nothing; it used to wait forever.
func TestClusterBackupFailsWhenEtcdIsUnreachable(t *testing.T) {
	cfg := clusterConfigFile(t, "box-1", "http://"+testenv.FreeAddr(t))
	dst := filepath.Join(t.TempDir(), "backup.db")
	ctx, cancel := context.WithTimeout(context.Background(), 3*etcdRequestTimeout)
	defer cancel()
	r := runCLICtx(t, ctx, nil, "--config", cfg, "cluster", "backup", dst)
	if r.code != 1 || !strings.Contains(r.stderr, "began the snapshot within") {
		t.Errorf("backup against no etcd: exit %d, stderr %q; want 1 saying no member began the snapshot", r.code, r.stderr)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("backup against no etcd left %s (stat: %v)", dst, err)
	}
}

// A restore whose member name or initial cluster a node's config would
// refuse is a usage error (exit 2), and makes no data directory: such a
// member could never be started.
func TestClusterRestoreRefusesBadNamesAndURLs(t *testing.T) {
	m := startTestMember(t, "box-1", t.TempDir(), "", "", false)
	cfg := clusterConfigFile(t, "box-1", m.clientURL)
	file := filepath.Join(t.TempDir(), "cluster.snap")
	if r := runCLI(t, nil, "--config", cfg, "cluster", "backup", file); r.code != 0 {
		t.Fatalf("cluster backup: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, tc := range []struct{ name, initial string }{
		{"Box_1", "Box_1=http://127.0.0.1:2380"},
		{"box-1", "box-1=127.0.0.1:2380"},
		{"box-1", "box-1=http://127.0.0.1:2380,box-2"},
		{"box-1", "box-1=http://127.0.0.1:2380,box-2=http://127.0.0.1"},
	} {
		dir := filepath.Join(t.TempDir(), "etcd")
		r := runCLI(t, nil, "cluster", "restore", file, "--data-dir", dir, "--name", tc.name, "--initial-cluster", tc.initial)
		if r.code != 2 {
			t.Errorf("restore --name %q --initial-cluster %q: exit %d, stderr %q; want 2", tc.name, tc.initial, r.code, r.stderr)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("restore --name %q --initial-cluster %q made %s (stat: %v)", tc.name, tc.initial, dir, err)
		}
	}
}
