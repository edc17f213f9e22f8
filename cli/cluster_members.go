package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/config"
)

// maxVoters is the most voting etcd members the cluster commands make: each
// voter adds to every write's latency, and five tolerate two failures,
// enough for any site inferd is for; more nodes join as clients
// (cluster.etcd.endpoints) or learners.
const maxVoters = 5

// memberList lists the etcd members (linearizable unless opts say
// otherwise), bounded by the request timeout.
func (c *clusterConn) memberList(parent context.Context, opts ...clientv3.OpOption) (*clientv3.MemberListResponse, error) {
	ctx, cancel := c.ctx(parent)
	defer cancel()
	resp, err := c.cli.MemberList(ctx, opts...)
	if err != nil {
		// Every verb starts here: the hint is said once, for all of them.
		return nil, fmt.Errorf("no etcd member answers at %s (list etcd members: %w); if this node's member is down, "+
			"name another member's client URL with --endpoints", strings.Join(c.cli.Endpoints(), ","), err)
	}
	return resp, nil
}

func (c *clusterCommand) members(ctx context.Context, args []string) error {
	conn, err := c.flagsOnly("members", args)
	if err != nil {
		return err
	}
	defer conn.close()
	list, err := conn.memberList(ctx, clientv3.WithSerializable())
	if err != nil {
		return err
	}
	printMembers(c.env.stdout, conn.memberStates(ctx, list.Members))
	fmt.Fprintf(c.env.stdout, "%d voters, %d learners\n", voters(list.Members), len(list.Members)-voters(list.Members))
	return nil
}

func (c *clusterCommand) addMember(ctx context.Context, args []string) error {
	fs := subFlags("cluster add-member")
	learner := fs.Bool("learner", false, "add a non-voting member (promote it with promote-member once it has caught up)")
	clientURL := fs.String("client-url", "", "the new member's client URL for the printed config (default: its peer URL's host, port 2379)")
	eps := endpointsFlag(fs)
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("%w: add-member needs NAME and PEERURL", errUsage)
	}
	name, peerURL := pos[0], strings.TrimSuffix(pos[1], "/")
	if !config.ValidNodeName(name) {
		return fmt.Errorf("%w: member name %q must be 1-64 characters of a-z, 0-9 and - (the node's cluster.name)", errUsage, name)
	}
	if err := checkMemberURL(peerURL); err != nil {
		return fmt.Errorf("%w: PEERURL: %v", errUsage, err)
	}
	if *clientURL == "" {
		u, _ := url.Parse(peerURL)
		*clientURL = u.Scheme + "://" + net.JoinHostPort(u.Hostname(), "2379")
	} else if err := checkMemberURL(*clientURL); err != nil {
		return fmt.Errorf("%w: --client-url: %v", errUsage, err)
	}
	conn, err := c.env.connect(*eps)
	if err != nil {
		return err
	}
	defer conn.close()
	list, err := conn.memberList(ctx)
	if err != nil {
		return err
	}
	for _, m := range list.Members {
		switch {
		case m.Name == name:
			return fmt.Errorf("%s is a member already (id %x)", name, m.ID)
		case contains(m.PeerURLs, peerURL):
			return fmt.Errorf("member %s has peer URL %s already", memberName(m), peerURL)
		case m.Name == "":
			return fmt.Errorf("member %x (%s) was added but has not started: start it, or remove it with remove-member %x, before adding another",
				m.ID, strings.Join(m.PeerURLs, ","), m.ID)
		}
	}
	if n := voters(list.Members); !*learner && n >= maxVoters {
		return fmt.Errorf("the cluster has %d voters, the most it should have: add %s with --learner and leave it one, "+
			"or run it as a client node (cluster.etcd.endpoints)", n, name)
	}
	cctx, cancel := conn.ctx(ctx)
	defer cancel()
	var resp *clientv3.MemberAddResponse
	if *learner {
		resp, err = conn.cli.MemberAddAsLearner(cctx, []string{peerURL})
	} else {
		resp, err = conn.cli.MemberAdd(cctx, []string{peerURL})
	}
	if err != nil {
		return fmt.Errorf("add etcd member %s: %w", name, unhealthyErr(err))
	}
	w := c.env.stdout
	role := "voter"
	if *learner {
		role = "learner"
	}
	fmt.Fprintf(w, "added etcd member %s (id %x) as a %s at %s\n\n", name, resp.Member.ID, role, peerURL)
	fmt.Fprintf(w, "Start inferd on %s with this cluster: section (the secret file is the one every node shares):\n\n", name)
	// advertise: a node listening on every address (the walkthrough's
	// 0.0.0.0:8080) refuses to start without it.
	fmt.Fprintf(w, "cluster:\n  name: %s\n  advertise: %s   # this node's API as the other nodes reach it (the port of its listen)\n"+
		"  secretFile: /etc/inferd/cluster-secret\n  etcd:\n    embed:\n", name, advertiseGuess(peerURL))
	fmt.Fprintf(w, "      peerURL: %s\n      clientURL: %s\n      initialCluster: %s\n      join: true\n\n",
		peerURL, *clientURL, initialCluster(resp.Members, resp.Member.ID, name))
	if *learner {
		fmt.Fprintf(w, "Once it has caught up (cluster members shows it healthy): inferd cluster promote-member %s\n", name)
		return nil
	}
	fmt.Fprintf(w, "Start it now, %s is one of the voters a write needs: ", name)
	printVoters(w, resp.Members)
	return nil
}

func (c *clusterCommand) promoteMember(ctx context.Context, args []string) error {
	conn, m, list, err := c.namedMember(ctx, "promote-member", args)
	if err != nil {
		return err
	}
	defer conn.close()
	if !m.IsLearner {
		return fmt.Errorf("%s is a voter already", args[0])
	}
	if n := voters(list); n >= maxVoters {
		return fmt.Errorf("the cluster has %d voters, the most it should have: %s stays a learner", n, args[0])
	}
	resp, err := conn.promote(ctx, m.ID)
	if err != nil {
		return fmt.Errorf("promote etcd member %s: %w", args[0], err)
	}
	fmt.Fprintf(c.env.stdout, "promoted %s: ", args[0])
	printVoters(c.env.stdout, resp.Members)
	return nil
}

func (c *clusterCommand) removeMember(ctx context.Context, args []string) error {
	conn, m, list, err := c.namedMember(ctx, "remove-member", args)
	if err != nil {
		return err
	}
	defer conn.close()
	name := args[0]
	if !m.IsLearner && voters(list) == 1 {
		return fmt.Errorf("refusing to remove %s, the last voter: the cluster's records would have no member left "+
			"(back it up with cluster backup; add another member first to move it)", name)
	}
	cctx, cancel := conn.ctx(ctx)
	defer cancel()
	resp, err := conn.cli.MemberRemove(cctx, m.ID)
	if err != nil {
		return fmt.Errorf("remove etcd member %s: %w", name, unhealthyErr(err))
	}
	fmt.Fprintf(c.env.stdout, "removed etcd member %s: ", name)
	printVoters(c.env.stdout, resp.Members)
	fmt.Fprintf(c.env.stdout, "Stop inferd on %s if it still runs. Before it joins again (add-member), delete its member's data (<dataDir>/etcd).\n", name)
	return nil
}

// unhealthyErr explains etcd's refusal of a membership change for want of
// members it has heard from lately; other errors pass as they are.
func unhealthyErr(err error) error {
	if rpctypes.ErrorDesc(err) != rpctypes.ErrorDesc(rpctypes.ErrGRPCUnhealthy) {
		return err
	}
	return fmt.Errorf("etcd refused (%w): it counts only the members connected for the last 5 seconds, "+
		"and too few would be left (a member just started, or one is down); try again once cluster status shows them healthy", err)
}

// namedMember is the start of the verbs that take one member NAME (or the
// hex id of a member that never started): it parses args, connects and
// finds the member. The caller closes the connection.
func (c *clusterCommand) namedMember(ctx context.Context, verb string, args []string) (*clusterConn, *etcdserverpb.Member, []*etcdserverpb.Member, error) {
	fs := subFlags("cluster " + verb)
	eps := endpointsFlag(fs)
	pos, err := parseSub(fs, args)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(pos) != 1 {
		return nil, nil, nil, fmt.Errorf("%w: %s needs exactly one NAME (or the id of a member that never started)", errUsage, verb)
	}
	conn, err := c.env.connect(*eps)
	if err != nil {
		return nil, nil, nil, err
	}
	list, err := conn.memberList(ctx)
	if err == nil {
		var m *etcdserverpb.Member
		if m, err = findMember(list.Members, pos[0]); err == nil {
			return conn, m, list.Members, nil
		}
	}
	conn.close()
	return nil, nil, nil, err
}

// printVoters says how many voters the cluster has, what a write needs,
// and warns of an even number.
func printVoters(w io.Writer, ms []*etcdserverpb.Member) {
	n := voters(ms)
	fmt.Fprintf(w, "the cluster has %d voters; writes need %d\n", n, n/2+1)
	warnEven(w, n)
}

// warnEven warns of an even number of voters: it tolerates as few failures
// as one voter fewer, and makes every write wait for one more.
func warnEven(w io.Writer, voters int) {
	if voters > 0 && voters%2 == 0 {
		fmt.Fprintf(w, "warning: %d voters tolerate %d failed, as %d do: run 1, 3 or 5\n", voters, (voters-1)/2, voters-1)
	}
}

// promoteWait is how long promote-member waits for a learner to catch up
// with the leader (etcd refuses to promote one that lags).
const promoteWait = time.Minute

// promote makes learner id a voter, trying again while etcd says it has
// not caught up yet, for up to promoteWait.
func (c *clusterConn) promote(parent context.Context, id uint64) (*clientv3.MemberPromoteResponse, error) {
	deadline := time.Now().Add(promoteWait)
	for {
		ctx, cancel := c.ctx(parent)
		resp, err := c.cli.MemberPromote(ctx, id)
		cancel()
		if err == nil || rpctypes.ErrorDesc(err) != rpctypes.ErrorDesc(rpctypes.ErrGRPCLearnerNotReady) || time.Now().After(deadline) {
			return resp, err
		}
		// The learner is still receiving the leader's log; the pause keeps
		// the asking gentle, it synchronizes nothing.
		select {
		case <-time.After(200 * time.Millisecond):
		case <-parent.Done():
			return nil, parent.Err()
		}
	}
}

// findMember finds a member by name, or by its hex id (a member added but
// not started has no name yet).
func findMember(ms []*etcdserverpb.Member, name string) (*etcdserverpb.Member, error) {
	for _, m := range ms {
		if m.Name == name || (m.Name == "" && strconv.FormatUint(m.ID, 16) == name) {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no etcd member %s (cluster members lists them)", name)
}

// voters counts the voting members.
func voters(ms []*etcdserverpb.Member) int {
	n := 0
	for _, m := range ms {
		if !m.IsLearner {
			n++
		}
	}
	return n
}

// initialCluster is the initialCluster a member joining ms starts with:
// name=peerURL for each member, the new one (id) under name.
func initialCluster(ms []*etcdserverpb.Member, id uint64, name string) string {
	ms = slices.Clone(ms)
	slices.SortFunc(ms, func(a, b *etcdserverpb.Member) int {
		return strings.Compare(cmp.Or(a.Name, name), cmp.Or(b.Name, name))
	})
	var parts []string
	for _, m := range ms {
		n := m.Name
		if m.ID == id {
			n = name
		}
		for _, u := range m.PeerURLs {
			parts = append(parts, n+"="+u)
		}
	}
	return strings.Join(parts, ",")
}

// checkMemberURL checks an etcd member URL: http(s)://host:port.
// advertiseGuess is the advertise URL add-member prints for a member at
// peerURL: its host, the API's default port.
func advertiseGuess(peerURL string) string {
	u, _ := url.Parse(peerURL) // checked by checkMemberURL
	return "http://" + net.JoinHostPort(u.Hostname(), "8080")
}

func checkMemberURL(u string) error {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Hostname() == "" || p.Port() == "" ||
		strings.Trim(p.Path, "/") != "" {
		return errors.New(u + " must be http://host:port or https://host:port")
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if strings.TrimSuffix(v, "/") == s {
			return true
		}
	}
	return false
}
