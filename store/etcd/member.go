package etcd

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TLSFiles are the PEM files of one side of etcd's TLS: the member's
// certificate and key, and the CA that signs the other side's certificates
// (a member then requires them: mutual TLS).
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// info is f for etcd's transport; a CA makes the member require client
// certificates signed by it.
func (f TLSFiles) info() transport.TLSInfo {
	requireCerts := transport.TLSInfo{TrustedCAFile: f.CAFile, ClientCertAuth: f.CAFile != ""}
	requireCerts.CertFile, requireCerts.KeyFile = f.CertFile, f.KeyFile
	return requireCerts
}

// MemberConfig configures an etcd member run inside this process.
type MemberConfig struct {
	Name      string // the member's name, unique in the etcd cluster
	DataDir   string // where the member keeps its write-ahead log and database
	PeerURL   string // listened on and advertised to the other members
	ClientURL string // listened on and advertised to clients (the inferd nodes)
	// InitialCluster lists every member of a new cluster as
	// name=peerURL,…; empty means this member alone.
	InitialCluster string
	// Join is true for a member joining a running cluster ("existing"),
	// false for one of the members that start a new one.
	Join bool
	// ClientTLS and PeerTLS secure the two listeners; empty means plain
	// http (the URLs say http then).
	ClientTLS, PeerTLS TLSFiles
	// HeartbeatMs and ElectionMs are etcd's raft timing; 0 means
	// DefaultHeartbeatMs and DefaultElectionMs. Tests use 10 and 100.
	HeartbeatMs, ElectionMs uint
	// StartTimeout bounds the wait for the member to join its cluster; 0
	// means 60 s.
	StartTimeout time.Duration
	// Log receives etcd's own errors (it logs much, at every level; only
	// errors are kept). Nil discards them.
	Log io.Writer
}

// The raft timing of an embedded member, half of etcd's own defaults (100
// and 1000 ms). When the member that leads the raft dies, the others elect
// another within one to two election timeouts, and until then no write is
// answered: every node pauses that long (then TryTimeout at most, see
// DefaultTryTimeout). Measured with three nodes, the node holding etcd's
// leader killed: 1.2-1.9 s pauses with etcd's timing, 0.6-1.3 s with
// this. Members of one cluster on a LAN answer each other in well under
// the 50 ms heartbeat (etcd wants the election timeout about ten times the
// members' round trip). The members of a cluster should share one
// timing; an external etcd keeps its own.
const (
	DefaultHeartbeatMs = 50
	DefaultElectionMs  = 500
)

// Member is a running embedded etcd member.
type Member struct {
	e     *embed.Etcd
	once  sync.Once // embed's Close panics when called twice
	quiet *quietWriter
}

// StartMember starts an etcd member in this process and waits until it
// serves clients. Close stops it.
func StartMember(c MemberConfig) (*Member, error) {
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.DataDir
	purl, err := url.Parse(c.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: peer URL %q: %w", c.Name, c.PeerURL, err)
	}
	curl, err := url.Parse(c.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: client URL %q: %w", c.Name, c.ClientURL, err)
	}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*purl}, []url.URL{*purl}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*curl}, []url.URL{*curl}
	cfg.InitialCluster = c.InitialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = c.Name + "=" + c.PeerURL
	}
	cfg.ClusterState = embed.ClusterStateFlagNew
	if c.Join {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.ClientTLSInfo, cfg.PeerTLSInfo = c.ClientTLS.info(), c.PeerTLS.info()
	cfg.TickMs, cfg.ElectionMs = DefaultHeartbeatMs, DefaultElectionMs
	if c.HeartbeatMs > 0 {
		cfg.TickMs = c.HeartbeatMs
	}
	if c.ElectionMs > 0 {
		cfg.ElectionMs = c.ElectionMs
	}
	// Every call write makes a revision: keep an hour of history, so the
	// database stays bounded without an operator.
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = "periodic", "1h"
	quiet := &quietWriter{w: c.Log}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapTo(quiet))
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd member %s in %s: %w", c.Name, c.DataDir, err)
	}
	timeout := c.StartTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return &Member{e: e, quiet: quiet}, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("start etcd member %s: %w", c.Name, err)
	case <-t.C:
		e.Close()
		return nil, fmt.Errorf("start etcd member %s: not serving after %s (are the other members of %q up?)",
			c.Name, timeout, cfg.InitialCluster)
	}
}

// ClientURLs returns the URLs the member serves clients on.
func (m *Member) ClientURLs() []string {
	var out []string
	for _, u := range m.e.Config().AdvertiseClientUrls {
		out = append(out, u.String())
	}
	return out
}

// Endpoints returns the client URLs the node reaches etcd through: this
// member's own. A learner (a member added as one, `inferd cluster
// add-member --learner`, and not promoted yet) serves no requests but
// serializable reads, so while this member is one they are the voting
// members' URLs as this member's view of the cluster has them. The list is
// taken once: a node whose member was promoted uses its own after its
// next start.
func (m *Member) Endpoints() []string {
	srv := m.e.Server
	if !srv.IsLearner() {
		return m.ClientURLs()
	}
	var out []string
	for _, mem := range srv.Cluster().Members() {
		if !mem.IsLearner {
			out = append(out, mem.ClientURLs...)
		}
	}
	if len(out) == 0 {
		return m.ClientURLs() // no voter known: let the requests say why
	}
	return out
}

// Err reports a fatal error of the running member (its listeners failed);
// the daemon stops on it.
func (m *Member) Err() <-chan error { return m.e.Err() }

// Close stops the member; what it committed stays in its data directory.
// Closing it again does nothing.
func (m *Member) Close() error {
	m.once.Do(func() {
		m.quiet.closing.Store(true)
		m.e.Close()
	})
	return nil
}

// quietWriter passes the member's log lines on until the member is being
// closed: etcd then logs each listener it shuts as an error ("http: Server
// closed"), which is no news.
type quietWriter struct {
	w       io.Writer
	closing atomic.Bool
}

func (q *quietWriter) Write(p []byte) (int, error) {
	if q.w == nil || q.closing.Load() {
		return len(p), nil
	}
	return q.w.Write(p)
}

// zapTo returns a zap logger that writes etcd's errors to w as JSON lines.
func zapTo(w io.Writer) *zap.Logger {
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), zapcore.ErrorLevel))
}

// ClientTLS returns the TLS configuration of a client that presents f's
// certificate (if any) and trusts f's CA (if any; else the system's).
func ClientTLS(f TLSFiles) (*tls.Config, error) {
	info := transport.TLSInfo{CertFile: f.CertFile, KeyFile: f.KeyFile, TrustedCAFile: f.CAFile}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd client TLS: %w", err)
	}
	return cfg, nil
}
