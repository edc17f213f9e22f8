package cli

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"inferd/cluster"
	"inferd/config"
	"inferd/store/etcd"
)

// clusterCommand operates a cluster (docs/cluster.md): it talks to etcd
// directly, with the cluster: section of the node's config file, not to
// the daemon, so it works whichever daemons run as long as etcd answers.
// The verbs are in cluster_*.go.
type clusterCommand struct{ env *env }

func (c *clusterCommand) Usage() string {
	return `Usage:
  inferd cluster init DIR --hosts HOST,... [--force]
  inferd [global flags] cluster status [--endpoints URL,...]
  inferd [global flags] cluster members [--endpoints URL,...]
  inferd [global flags] cluster add-member NAME PEERURL [--learner] [--client-url URL]
  inferd [global flags] cluster promote-member NAME
  inferd [global flags] cluster remove-member NAME
  inferd [global flags] cluster backup [--force] FILE
  inferd [global flags] cluster restore FILE [--data-dir DIR] [--name NAME] [--initial-cluster NAME=PEERURL,...]
  inferd [global flags] cluster import [--force] BOLT-FILE

Each verb talks to etcd directly, not to the daemon, with the cluster:
section of the node's config (--config): the etcd endpoints, or the client
URL of the member the node embeds, and the TLS files; --endpoints replaces
those (another member's client URL when this node's member is down: an
embedded member runs inside its daemon).

init        makes what every node shares, once, into DIR: the cluster
            secret and the TLS files (a CA and one node certificate for
            every host given) that make etcd answer inferd's nodes alone;
            prints the config lines that use them. Copy DIR to every box.
            --force issues a new node certificate with the same CA
status      the etcd members with their health, etcd's leader and inferd's
            leader, and the live inferd nodes with their capacity; exit 1
            when etcd has no quorum
members     the etcd members, voters and learners
add-member  adds an etcd member (a voter, or with --learner a non-voting
            member to promote once it has caught up) and prints the
            cluster: section the new node starts with (join: true)
promote-member  makes a learner a voter
remove-member   removes an etcd member; refuses to remove the last voter
backup      an etcd snapshot of the whole cluster state, checked, fsynced,
            then renamed to FILE (--force replaces FILE)
restore     makes a new member data directory from a snapshot (default: the
            config's member, name and initialCluster; the directory must not
            exist); every member of the restored cluster is made from the
            same snapshot
import      copies a single box's bbolt data file (its daemon stopped)
            into the cluster: teams with quotas and webhook secrets, keys
            (their hashes), projects, unexpired calls (those not finished
            pending on this node, recovered at its next start); refuses a
            cluster that holds teams, keys or projects the file lacks
            unless --force; running it again writes only what is missing

Run 1, 3 or 5 voters: an even number tolerates no more failures than one
voter fewer does, and each voter adds to every write's latency.
`
}

func (c *clusterCommand) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "cluster", args,
		subcommand{"init", c.initCluster},
		subcommand{"status", c.status}, subcommand{"members", c.members},
		subcommand{"add-member", c.addMember}, subcommand{"promote-member", c.promoteMember},
		subcommand{"remove-member", c.removeMember},
		subcommand{"backup", c.backup}, subcommand{"restore", c.restore},
		subcommand{"import", c.importBolt})
}

// etcdRequestTimeout bounds each etcd request of a cluster command, so a
// cluster without quorum answers within seconds instead of hanging.
const etcdRequestTimeout = 5 * time.Second

// clusterConn is a cluster command's connection to etcd.
type clusterConn struct {
	cfg    config.Config
	cli    *clientv3.Client
	tls    *tls.Config // nil for plain http
	prefix string      // inferd's key prefix, ending in "/"
}

// endpointsFlag adds --endpoints to a verb's flags.
func endpointsFlag(fs *flag.FlagSet) *string {
	return fs.String("endpoints", "", "etcd client URLs, comma-separated (default: from the config)")
}

// clusterConfig loads the config and checks it has a cluster: section.
func (e *env) clusterConfig() (config.Config, error) {
	cfg, err := e.config()
	if err != nil {
		return cfg, err
	}
	if cfg.Cluster == nil {
		return cfg, errors.New("the config has no cluster: section; pass --config with a cluster node's config file (docs/cluster.md)")
	}
	return cfg, nil
}

// connect opens a client to the cluster's etcd: the endpoints given (a
// comma-separated list), else the config's endpoints or its member's client
// URL. Close it with close.
func (e *env) connect(endpoints string) (*clusterConn, error) {
	cfg, err := e.clusterConfig()
	if err != nil {
		return nil, err
	}
	c := cfg.Cluster
	eps := c.Etcd.Endpoints
	if c.Etcd.Embed != nil {
		eps = []string{c.Etcd.Embed.ClientURL}
	}
	if endpoints != "" {
		if eps, err = parseEndpoints(endpoints); err != nil {
			return nil, err
		}
	}
	conn := &clusterConn{cfg: cfg, prefix: c.Etcd.Prefix}
	if conn.prefix == "" {
		conn.prefix = etcd.DefaultPrefix
	}
	if !strings.HasSuffix(conn.prefix, "/") {
		conn.prefix += "/"
	}
	if files := etcd.TLSFiles(c.Etcd.TLS); files != (etcd.TLSFiles{}) {
		if conn.tls, err = etcd.ClientTLS(files); err != nil {
			return nil, fmt.Errorf("cluster.etcd.tls: %w", err)
		}
	}
	dial := c.Etcd.DialTimeout
	if dial <= 0 {
		dial = 5 * time.Second
	}
	conn.cli, err = clientv3.New(clientv3.Config{Endpoints: eps, TLS: conn.tls, DialTimeout: dial, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd at %s: %w", strings.Join(eps, ","), err)
	}
	return conn, nil
}

// parseEndpoints reads --endpoints: comma-separated http(s)://host:port
// URLs, spaces around each allowed. A mistyped list is a usage error at
// once, not a dial that times out and blames the cluster.
func parseEndpoints(list string) ([]string, error) {
	var eps []string
	for _, ep := range strings.Split(list, ",") {
		ep = strings.TrimSpace(ep)
		if checkMemberURL(ep) != nil {
			return nil, fmt.Errorf("%w: --endpoints: %q is not an http://host:port or https://host:port URL", errUsage, ep)
		}
		eps = append(eps, ep)
	}
	return eps, nil
}

func (c *clusterConn) close() { c.cli.Close() }

// ctx is the context of one etcd request.
func (c *clusterConn) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, etcdRequestTimeout)
}

// memberState is what status learned of one etcd member.
type memberState struct {
	member  *etcdserverpb.Member
	status  *clientv3.StatusResponse // nil when it did not answer
	problem string                   // why it is not healthy; "" when it is
}

// clusterState is what status shows.
type clusterState struct {
	members    []memberState
	listErr    error // MemberList failed: no member answered, nothing else was read
	quorum     bool  // a linearizable read succeeded
	quorumErr  error
	etcdLeader string
	leader     string // inferd's leader (election key), "" when none
	nodes      []cluster.NodeInfo
	badNodes   []string // the nodes/ records that do not decode, each with why
	nodesErr   error
}

// flagsOnly is the start of the verbs that take no arguments but
// --endpoints: it parses args and connects.
func (c *clusterCommand) flagsOnly(verb string, args []string) (*clusterConn, error) {
	fs := subFlags("cluster " + verb)
	eps := endpointsFlag(fs)
	if err := parseFlagsOnly(fs, args); err != nil {
		return nil, err
	}
	return c.env.connect(*eps)
}

func (c *clusterCommand) status(ctx context.Context, args []string) error {
	conn, err := c.flagsOnly("status", args)
	if err != nil {
		return err
	}
	defer conn.close()
	st := conn.state(ctx)
	w := c.env.stdout
	if st.listErr != nil {
		return fmt.Errorf("cluster unreachable: %w", st.listErr)
	}
	printMembers(w, st.members)
	voters, up := 0, 0
	for _, m := range st.members {
		if !m.member.IsLearner {
			voters++
			if m.problem == "" {
				up++
			}
		}
	}
	if st.quorum {
		fmt.Fprintf(w, "quorum: yes (%d of %d voters healthy; writes need %d)\n", up, voters, voters/2+1)
	} else {
		fmt.Fprintf(w, "quorum: NO (%d of %d voters healthy; writes need %d): %v\n", up, voters, voters/2+1, st.quorumErr)
	}
	fmt.Fprintf(w, "etcd leader: %s\n", orNone(st.etcdLeader))
	fmt.Fprintf(w, "inferd leader: %s\n", orNone(st.leader))
	if st.nodesErr != nil {
		fmt.Fprintf(w, "inferd nodes: unknown: %v\n", st.nodesErr)
	} else if st.quorum {
		printNodes(w, st.nodes)
		for _, bad := range st.badNodes {
			fmt.Fprintf(w, "bad node record: %s\n", bad)
		}
	}
	warnEven(w, voters)
	switch {
	case !st.quorum:
		return errors.New("cluster unhealthy: etcd has no quorum (see docs/cluster.md, \"Losing quorum\")")
	case st.nodesErr != nil:
		return fmt.Errorf("cluster unhealthy: the inferd nodes could not be read: %w", st.nodesErr)
	case len(st.badNodes) > 0:
		return fmt.Errorf("cluster unhealthy: %d node record(s) under %s do not decode (listed above); the node that wrote one puts it again at its next change, or delete it", len(st.badNodes), cluster.NodesPrefix)
	}
	return nil
}

// state gathers what status shows. Each request is bounded; what fails is
// reported in the state, not returned.
func (c *clusterConn) state(parent context.Context) clusterState {
	var st clusterState
	// A serializable list is answered by any member, quorum or not.
	list, err := c.memberList(parent, clientv3.WithSerializable())
	if err != nil {
		st.listErr = err
		return st // no member answers: nothing more can be read
	}
	st.members = c.memberStates(parent, list.Members)
	sort.Slice(st.members, func(i, j int) bool { return memberName(st.members[i].member) < memberName(st.members[j].member) })
	for _, m := range st.members {
		if m.status != nil && m.status.Leader != 0 {
			for _, l := range st.members {
				if l.member.ID == m.status.Leader {
					st.etcdLeader = memberName(l.member)
				}
			}
			break
		}
	}
	// Quorum: a linearizable read succeeds only with a majority of voters.
	ctx, cancel := c.ctx(parent)
	defer cancel()
	if _, err := c.cli.Get(ctx, c.prefix+"schema"); err != nil {
		st.quorumErr = err
		return st // nothing more can be read
	}
	st.quorum = true
	st.leader, _ = c.inferdLeader(ctx)
	st.nodes, st.badNodes, st.nodesErr = c.nodes(ctx)
	return st
}

// memberStates asks every member for its status at once, so members that
// do not answer cost one timeout, not one each.
func (c *clusterConn) memberStates(ctx context.Context, ms []*etcdserverpb.Member) []memberState {
	out := make([]memberState, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { out[i] = c.memberState(ctx, m) })
	}
	wg.Wait()
	return out
}

// memberState asks one member for its status at its first client URL.
func (c *clusterConn) memberState(parent context.Context, m *etcdserverpb.Member) memberState {
	ms := memberState{member: m}
	if len(m.ClientURLs) == 0 {
		ms.problem = "not started (added, never joined)"
		return ms
	}
	ctx, cancel := context.WithTimeout(parent, 2*time.Second)
	defer cancel()
	s, err := c.cli.Status(ctx, m.ClientURLs[0])
	switch {
	case err != nil:
		ms.problem = "unreachable: " + shortErr(err)
	case len(s.Errors) > 0:
		ms.status, ms.problem = s, "errors: "+strings.Join(s.Errors, "; ")
	case s.Leader == 0:
		ms.status, ms.problem = s, "no leader"
	default:
		ms.status = s
	}
	return ms
}

// inferdLeader reads the leader of inferd's election: the candidate with
// the oldest key under election/ (as concurrency.Election decides).
func (c *clusterConn) inferdLeader(ctx context.Context) (string, error) {
	resp, err := c.cli.Get(ctx, c.prefix+cluster.ElectionPrefix, clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	v := resp.Kvs[0].Value
	var n struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(v, &n) == nil && n.Name != "" {
		return n.Name, nil
	}
	return string(v), nil
}

// nodes reads the live inferd nodes (nodes/, each under its lease). A
// record that does not decode hides no other: it is named in bad (its key
// and why), and the others are returned.
func (c *clusterConn) nodes(ctx context.Context) (nodes []cluster.NodeInfo, bad []string, err error) {
	resp, err := c.cli.Get(ctx, c.prefix+cluster.NodesPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, err
	}
	nodes = make([]cluster.NodeInfo, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var n cluster.NodeInfo
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			bad = append(bad, fmt.Sprintf("%s does not decode: %v", kv.Key, err))
			continue
		}
		nodes = append(nodes, n)
	}
	return nodes, bad, nil
}

// printMembers writes the member table.
func printMembers(w io.Writer, ms []memberState) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tID\tROLE\tHEALTH\tPEER URL\tCLIENT URL\tVERSION\tDB SIZE")
	for _, m := range ms {
		role, health, version, size := "voter", "healthy", "-", "-"
		if m.member.IsLearner {
			role = "learner"
		}
		if m.status != nil {
			if m.status.Leader == m.member.ID {
				role += ", leader"
			}
			version, size = m.status.Version, fmt.Sprintf("%.1f MiB", float64(m.status.DbSize)/(1<<20))
		}
		if m.problem != "" {
			health = m.problem
		}
		fmt.Fprintf(tw, "%s\t%x\t%s\t%s\t%s\t%s\t%s\t%s\n", memberName(m.member), m.member.ID, role, health,
			strings.Join(m.member.PeerURLs, ","), orNone(strings.Join(m.member.ClientURLs, ",")), version, size)
	}
	tw.Flush()
}

// printNodes writes the table of live inferd nodes.
func printNodes(w io.Writer, ns []cluster.NodeInfo) {
	fmt.Fprintf(w, "inferd nodes: %d live\n", len(ns))
	if len(ns) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADVERTISE\tMEMBER\tGPUS FREE/TOTAL MiB\tCPU SLOTS USED\tPROJECTS\tUPDATED")
	for _, n := range ns {
		gpus := make([]string, 0, len(n.Capacity.GPUs))
		for _, g := range n.Capacity.GPUs {
			s := fmt.Sprintf("%d:%d/%d", g.Index, g.FreeMiB, g.TotalMiB)
			if !g.Healthy {
				s += "(unhealthy)"
			}
			gpus = append(gpus, s)
		}
		member := "no"
		if n.Member {
			member = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\n", n.Name, n.Advertise, member, orNone(strings.Join(gpus, " ")),
			n.Capacity.CPUUsed, n.Capacity.CPUSlots, len(n.Projects), n.Updated.UTC().Format(time.RFC3339))
	}
	tw.Flush()
}

// memberName is a member's name, or what stands for it before it joined.
func memberName(m *etcdserverpb.Member) string {
	if m.Name == "" {
		return "(not started)"
	}
	return m.Name
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// shortErr is an error's text without grpc's decoration.
func shortErr(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer within the timeout"
	}
	return err.Error()
}
