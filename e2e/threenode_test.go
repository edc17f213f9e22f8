package e2e

// The three-node harness for cluster mode (#22, docs/cluster.md): three real
// inferd processes, each running one member of one embedded etcd cluster
// (initialCluster lists all three), sharing a cluster secret. The model is
// the echo example; each node passes E2E_NODE=<its name> to its replicas
// (replica.passEnv), so a reply ({"env":"E2E_NODE"}), a run log line
// ({"runLog":…}) or a model process's environment says which node ran it.
//
// Two layouts:
//   - loopback (the default): every node on 127.0.0.1 with ports of its own.
//     Nothing can cut one node off, but nothing needs root either.
//   - isolated (root only; what the cut-off scenario needs): each node in a
//     network namespace of its own with two links. Its "cluster" link is a
//     veth on a bridge shared by the three nodes: etcd peer and client
//     traffic and the API between nodes go there (the node advertises that
//     address), so taking the bridge side of that veth down cuts the node off
//     from the other two, both ways, as a pulled cable would, while its
//     process keeps running. Its "test" link is a veth straight to the test's
//     namespace, which the cut leaves alone, so the test still reaches the
//     cut-off node's API and sees what it answers. No node has a route
//     through the test's namespace (no default route), so nothing between
//     nodes can go around the cut.
//     TCP proxies in front of each node were the alternative; etcd members
//     dial the one peer URL each member advertises, so a proxy can cut
//     traffic to a node but not the node's own traffic to the others.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// clusterOpts shape one three-node cluster.
type clusterOpts struct {
	isolated bool      // network namespaces (root), so a node can be cut off
	extra    string    // YAML added to every node's config
	perNode  [3]string // YAML added to one node's config (gpu: …)
	// tls: etcd with the certificates `inferd cluster init` makes (https
	// URLs, mutual TLS on the client and peer listeners), and its secret.
	tls bool
	// ownUIDs: the replicas run under a uid of their project's own (the
	// default sandbox) rather than as root, as INFERD_REPLICA_USER=root
	// has the other scenarios do (their run logs are in the test's
	// private temporary directories).
	ownUIDs bool
}

// clusterNode is one of the three.
type clusterNode struct {
	name    string
	dir     string
	cfgPath string
	base    string // the API as the test reaches it
	etcdURL string // its etcd member's client URL
	ns      string // network namespace; "" on loopback
	hostEnd string // the bridge side of the node's cluster link (isolated)
	d       *daemon
	cluster *threeNodes
}

// threeNodes is a running three-node cluster.
type threeNodes struct {
	t      *testing.T
	nodes  [3]*clusterNode
	runLog string // the echo model's run log ({"runLog": path})
	bridge string // isolated only
	tlsDir string // clusterOpts.tls: what `inferd cluster init` made
	opts   clusterOpts
}

// newThreeNodes writes the three configs, starts the three daemons at once
// (a member of a new etcd cluster serves only once a quorum of members
// runs) and waits until each serves.
func newThreeNodes(t *testing.T, o clusterOpts) *threeNodes {
	t.Helper()
	c := &threeNodes{t: t, runLog: filepath.Join(t.TempDir(), "runs.jsonl"), opts: o}
	secret := clusterSecret(t)
	type addrs struct{ listen, advertise, peer, client, base string }
	var a [3]addrs
	if o.isolated {
		testenv.NeedRoot(t, "network namespaces and veth links (ip netns), to cut one node off")
		if _, err := exec.LookPath("ip"); err != nil {
			testenv.Missing(t, "ip (iproute2): apt-get install iproute2")
		}
		s := c.makeNetwork()
		for i := range a {
			ip := s.clusterIP(i)
			a[i] = addrs{listen: "0.0.0.0:8080", advertise: "http://" + ip + ":8080",
				peer: "http://" + ip + ":2380", client: "http://" + ip + ":2379",
				base: "http://" + s.testIP(i, 2) + ":8080"}
		}
	} else {
		ports := fixedPorts(t, 9)
		for i := range a {
			listen := fmt.Sprintf("127.0.0.1:%d", ports[3*i])
			a[i] = addrs{listen: listen, advertise: "http://" + listen,
				peer:   fmt.Sprintf("http://127.0.0.1:%d", ports[3*i+1]),
				client: fmt.Sprintf("http://127.0.0.1:%d", ports[3*i+2]), base: "http://" + listen}
		}
	}
	var tlsYAML, peerTLS string
	if o.tls {
		var hosts []string
		for i := range a {
			for j, u := range []*string{&a[i].peer, &a[i].client} {
				*u = "https" + strings.TrimPrefix(*u, "http")
				if j == 0 {
					hosts = append(hosts, strings.Split(strings.TrimPrefix(*u, "https://"), ":")[0])
				}
			}
		}
		dir := filepath.Join(t.TempDir(), "cluster")
		if out, err := exec.Command(inferdBin, "cluster", "init", dir, "--hosts", strings.Join(hosts, ",")).CombinedOutput(); err != nil {
			t.Fatalf("inferd cluster init: %v: %s", err, out)
		}
		secret = filepath.Join(dir, "cluster-secret")
		files := fmt.Sprintf("{certFile: %s, keyFile: %s, caFile: %s}",
			filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem"), filepath.Join(dir, "ca.pem"))
		peerTLS, tlsYAML = "      peerTLS: "+files+"\n", "    tls: "+files+"\n"
		c.tlsDir = dir
	}
	var initial []string
	for i := range a {
		initial = append(initial, fmt.Sprintf("node-%d=%s", i+1, a[i].peer))
	}
	for i := range c.nodes {
		n := &clusterNode{name: fmt.Sprintf("node-%d", i+1), dir: t.TempDir(), base: a[i].base, etcdURL: a[i].client, cluster: c}
		if o.isolated {
			n.ns, n.hostEnd = c.nsName(i), c.hostEnd(i)
		}
		cfg := fmt.Sprintf(`listen: %s
dataDir: ./data
log:
  format: json
  level: debug
startWait: %s
longPollWait: %s
# Room for the scenarios' replicas on every node (0 would be one per CPU:
# two here), so that a dead node's share fits on the other two.
cpuSlots: 8
replica:
  passEnv: [LD_LIBRARY_PATH, E2E_NODE]
%s%s
cluster:
  name: %s
  advertise: %s
  secretFile: %s
  etcd:
    embed:
      peerURL: %s
      clientURL: %s
      initialCluster: %s
%s%s`, a[i].listen, scaledSetting(20*time.Second), scaledSetting(30*time.Second), o.extra, o.perNode[i], n.name, a[i].advertise, secret, a[i].peer, a[i].client, strings.Join(initial, ","), peerTLS, tlsYAML)
		n.cfgPath = filepath.Join(n.dir, "config.yaml")
		if err := os.WriteFile(n.cfgPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		c.nodes[i] = n
	}
	for _, n := range c.nodes {
		n.launch(t)
	}
	for _, n := range c.nodes {
		n.waitServing(t)
	}
	return c
}

// fixedPorts returns n distinct loopback ports that are free now, below
// the kernel's ephemeral range. freePort's ports are in that range: while
// three nodes start, their etcd members' outgoing connections take
// ephemeral ports and can take a port picked for an API that does not
// listen yet (a node serves its API only once etcd has a quorum).
func fixedPorts(t *testing.T, n int) []int {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &low)
	}
	seen := map[int]bool{}
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries > 1000 {
			t.Fatalf("no %d free ports below %d", n, low)
		}
		r, _ := rand.Int(rand.Reader, big.NewInt(int64(low-10000)))
		port := 10000 + int(r.Int64())
		if seen[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		seen[port] = true
		out = append(out, port)
	}
	return out
}

// launch starts the node's daemon (again, after a kill) without waiting.
func (n *clusterNode) launch(t *testing.T) {
	t.Helper()
	args := []string{inferdBin, "--config", n.cfgPath, "serve"}
	if n.ns != "" {
		// ip netns exec execs the daemon in place: the pid is inferd's, so
		// a kill -9 reaches the daemon itself.
		args = append([]string{"ip", "netns", "exec", n.ns}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "INFERD_SECRET_PROBE=must-not-leak", "INFERD_REPLICA_USER=root", "E2E_NODE="+n.name)
	if n.cluster.opts.ownUIDs {
		cmd.Env = append(cmd.Env, "INFERD_REPLICA_USER=per-project") // the last of a name wins
	}
	n.d = launchDaemonCmd(t, cmd, n.dir, n.cfgPath)
	// Cleanups run last in, first out: this one, before each daemon's
	// own, stops all nodes of the cluster at once, as an operator would
	// stop a cluster; one by one, the last would wait on an etcd without
	// quorum for its final writes.
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, other := range n.cluster.nodes {
			wg.Go(other.d.stop)
		}
		wg.Wait()
	})
}

// waitServing waits until the node serves; the test reaches it at n.base,
// which differs from the listen address the daemon logs when isolated.
func (n *clusterNode) waitServing(t *testing.T) {
	t.Helper()
	// Generous: three race-built daemons and their etcd members start at
	// once on a shared 2-core box.
	n.d.waitServing(t, 90*time.Second)
	n.d.base = n.base
}

func (n *clusterNode) client(t *testing.T, key string) inferenceClient {
	return inferenceClient{t: t, base: n.base, key: key}
}

// others returns the nodes other than the ones named.
func (c *threeNodes) others(names ...string) []*clusterNode {
	var out []*clusterNode
	for _, n := range c.nodes {
		if !contains(names, n.name) {
			out = append(out, n)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// subnets are one test's addresses, a 10.a.y.0/22: 10.a.y.0/24 is the
// bridge between the nodes, 10.a.(y+1+i).0/24 node i's link to the test.
type subnets struct{ a, y int }

// clusterIP is node i's address on the bridge.
func (s subnets) clusterIP(i int) string { return fmt.Sprintf("10.%d.%d.%d", s.a, s.y, i+1) }

// testIP is an address on node i's test link: host 1 the test's end, 2 the node's.
func (s subnets) testIP(i, host int) string { return fmt.Sprintf("10.%d.%d.%d", s.a, s.y+1+i, host) }

// netID names this test's interfaces and namespaces: several test runs
// (engineers sharing a box) may set up networks at once.
func (c *threeNodes) netID() string { return strings.TrimPrefix(c.bridge, "ie2e") }
func (c *threeNodes) nsName(i int) string {
	return fmt.Sprintf("inferd-e2e-%s-%d", c.netID(), i+1)
}
func (c *threeNodes) hostEnd(i int) string { return fmt.Sprintf("%sc%d", c.bridge, i+1) }

// makeNetwork creates the bridge, the three namespaces and their links,
// and removes them all when the test ends.
func (c *threeNodes) makeNetwork() subnets {
	t := c.t
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	c.bridge = "ie2e" + hex.EncodeToString(b) // 10 characters; interface names stop at 15
	// A 10.a.y.0/22 of its own, drawn at random among those no route of
	// this box uses yet.
	routes, _ := exec.Command("ip", "-4", "route", "show").Output()
	var s subnets
	for try := 0; ; try++ {
		a, _ := rand.Int(rand.Reader, big.NewInt(50))
		y, _ := rand.Int(rand.Reader, big.NewInt(64))
		s = subnets{a: 200 + int(a.Int64()), y: 4 * int(y.Int64())}
		if !strings.Contains(string(routes), fmt.Sprintf("10.%d.", s.a)) || try > 20 {
			break
		}
	}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			exec.Command("ip", "netns", "del", c.nsName(i)).Run() // takes its veth ends along
		}
		exec.Command("ip", "link", "del", c.bridge).Run()
	})
	ip("link", "add", c.bridge, "type", "bridge")
	ip("link", "set", c.bridge, "up")
	for i := range c.nodes {
		ns := c.nsName(i)
		ip("netns", "add", ns)
		ip("-n", ns, "link", "set", "lo", "up")
		// The cluster link: eth0 in the namespace, its peer on the bridge.
		ip("link", "add", c.hostEnd(i), "type", "veth", "peer", "name", "eth0", "netns", ns)
		ip("link", "set", c.hostEnd(i), "master", c.bridge, "up")
		ip("-n", ns, "addr", "add", s.clusterIP(i)+"/24", "dev", "eth0")
		ip("-n", ns, "link", "set", "eth0", "up")
		// The test link: eth1 in the namespace (.2), its peer here (.1).
		testEnd := fmt.Sprintf("%st%d", c.bridge, i+1)
		ip("link", "add", testEnd, "type", "veth", "peer", "name", "eth1", "netns", ns)
		ip("addr", "add", s.testIP(i, 1)+"/24", "dev", testEnd)
		ip("link", "set", testEnd, "up")
		ip("-n", ns, "addr", "add", s.testIP(i, 2)+"/24", "dev", "eth1")
		ip("-n", ns, "link", "set", "eth1", "up")
	}
	return s
}

// clusterView is what the test reads of a node's /v1/status in cluster
// mode: the leader and the live nodes, as that node sees them.
type clusterView struct {
	Leader string `json:"leader"`
	Nodes  []struct {
		Name string `json:"name"`
	} `json:"nodes"`
	// Placement is read only to say, when a test fails, where the leader
	// placed each project.
	Placement []struct {
		Project string `json:"project"`
		Nodes   []struct {
			Node string `json:"node"`
			Min  int    `json:"min"`
			Max  int    `json:"max"`
		} `json:"nodes"`
	} `json:"placement"`
}

// view asks the node's /v1/status for its cluster view; ok is false when
// the node does not answer 200 with one (down, cut off, no quorum).
func (n *clusterNode) view(adminKey string) (v clusterView, ok bool) {
	status, raw, err := tryDoRaw("GET", n.base+"/v1/status", map[string]string{"X-Service-API-Key": adminKey}, "")
	if err != nil || status != http.StatusOK {
		return v, false
	}
	var all struct {
		Cluster *clusterView `json:"cluster"`
	}
	if json.Unmarshal(raw, &all) != nil || all.Cluster == nil {
		return v, false
	}
	return *all.Cluster, true
}

func (v clusterView) names() []string {
	var out []string
	for _, n := range v.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// waitLeader waits until every node in on agrees on one leader that is not
// among not, and returns it.
func (c *threeNodes) waitLeader(t *testing.T, adminKey string, timeout time.Duration, on []*clusterNode, not ...string) string {
	t.Helper()
	var leader string
	eventually(t, timeout, "one leader seen by every live node", func() bool {
		leader = ""
		for _, n := range on {
			v, ok := n.view(adminKey)
			if !ok || v.Leader == "" || contains(not, v.Leader) || (leader != "" && v.Leader != leader) {
				return false
			}
			leader = v.Leader
		}
		return true
	})
	return leader
}

// run is one line of the echo model's run log.
type run struct {
	Inputs struct {
		Tag string `json:"tag"`
	} `json:"inputs"`
	Node    string  `json:"env"`     // E2E_NODE: the calls that log runs ask for it
	Replica string  `json:"replica"` // the replica that ran it
	T       float64 `json:"t"`       // when it began, Unix seconds
}

// runs reads the run log: the nodes each tag ran on, in the order the
// runs began.
func (c *threeNodes) runs(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, r := range c.runLines(t) {
		out[r.Inputs.Tag] = append(out[r.Inputs.Tag], r.Node)
	}
	return out
}

func (c *threeNodes) runLines(t *testing.T) []run {
	t.Helper()
	raw, err := os.ReadFile(c.runLog)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	// A run being logged may have created the file, or be writing its
	// line, as the test reads: only whole lines count.
	whole := string(raw[:bytes.LastIndexByte(raw, '\n')+1])
	var out []run
	for _, line := range strings.Split(whole, "\n") {
		if line == "" {
			continue
		}
		var r run
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("run log line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// logged returns the inputs of a call whose runs are logged under tag, and
// which reports the node it ran on.
func (c *threeNodes) logged(tag string, more string) string {
	if more != "" {
		more = "," + more
	}
	return fmt.Sprintf(`{"tag":%q,"runLog":%q,"env":"E2E_NODE"%s}`, tag, c.runLog, more)
}

// waitRun waits until the call logged under tag has begun running and
// returns the node it runs on.
func (c *threeNodes) waitRun(t *testing.T, tag string, timeout time.Duration) string {
	t.Helper()
	var node string
	eventually(t, timeout, "a run of "+tag, func() bool {
		if r := c.runs(t)[tag]; len(r) > 0 {
			node = r[0]
			return true
		}
		return false
	})
	return node
}
