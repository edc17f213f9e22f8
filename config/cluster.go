package config

import (
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Cluster is the cluster: section (docs/cluster.md). Without it (nil) inferd
// is the single-box appliance on its bbolt file; with it, the node keeps
// its records in etcd, shared with the other nodes of the cluster.
type Cluster struct {
	// Name is this node's name, unique in the cluster; it also names the
	// node's etcd member when it runs one.
	Name string `koanf:"name"`
	// Advertise is the URL the other nodes reach this node's API at
	// (http://10.0.0.5:8080): forwarded starts and payload fetches. Empty
	// means http://<listen> when listen names a host, and is an error when
	// it listens on every address (0.0.0.0, [::]).
	Advertise string `koanf:"advertise"`
	// SecretFile holds the secret every node of the cluster shares (at
	// least 32 bytes, mode 600): requests between nodes are signed with
	// it (cluster.Signer) and refused without it.
	SecretFile string      `koanf:"secretFile"`
	Etcd       ClusterEtcd `koanf:"etcd"`
}

// AdvertiseURL is the URL other nodes reach this node's API at: Advertise,
// or http://<listen> when listen names a host.
func (c Config) AdvertiseURL() string {
	if c.Cluster == nil {
		return ""
	}
	if c.Cluster.Advertise != "" {
		return strings.TrimSuffix(c.Cluster.Advertise, "/")
	}
	return "http://" + c.Listen
}

// ClusterEtcd says which etcd holds the cluster's records: an external
// cluster (Endpoints) or a member this node runs (Embed), never both.
type ClusterEtcd struct {
	Endpoints []string   `koanf:"endpoints"`
	Embed     *EtcdEmbed `koanf:"embed"`
	// Prefix is put before every key; empty means "/inferd/".
	Prefix string `koanf:"prefix"`
	// TLS are the files this node talks to etcd with (a client certificate
	// and key, and the CA of the etcd servers); with Embed, the member's
	// client listener serves with the same certificate and requires
	// clients signed by the same CA.
	TLS TLSFiles `koanf:"tls"`
	// DialTimeout bounds the first connection to etcd; 0 means 5 s.
	DialTimeout time.Duration `koanf:"dialTimeout"`
}

// EtcdEmbed configures the etcd member this node runs.
type EtcdEmbed struct {
	PeerURL   string `koanf:"peerURL"`   // raft traffic with the other members
	ClientURL string `koanf:"clientURL"` // what inferd nodes connect to
	// InitialCluster lists the members that start a new cluster,
	// name=peerURL,…; empty means this member alone.
	InitialCluster string `koanf:"initialCluster"`
	// Join makes the member join a running cluster instead of starting one.
	Join bool `koanf:"join"`
	// DataDir is the member's data; relative to dataDir; empty means
	// <dataDir>/etcd.
	DataDir string   `koanf:"dataDir"`
	PeerTLS TLSFiles `koanf:"peerTLS"`
}

// TLSFiles are PEM files: a certificate with its key, and a CA.
type TLSFiles struct {
	CertFile string `koanf:"certFile"`
	KeyFile  string `koanf:"keyFile"`
	CAFile   string `koanf:"caFile"`
}

// EtcdDataDir is where the node's own etcd member keeps its data.
func (c Config) EtcdDataDir() string {
	if c.Cluster == nil || c.Cluster.Etcd.Embed == nil || c.Cluster.Etcd.Embed.DataDir == "" {
		return filepath.Join(c.DataDir, "etcd")
	}
	if d := c.Cluster.Etcd.Embed.DataDir; filepath.IsAbs(d) {
		return d
	}
	return filepath.Join(c.DataDir, c.Cluster.Etcd.Embed.DataDir)
}

// nodeName is what cluster.name accepts: a DNS label, as an etcd member
// name and a metrics label can carry it.
var nodeName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$`)

// ValidNodeName reports whether name is a valid cluster.name (and etcd
// member name): `inferd cluster add-member` checks the name it is given.
func ValidNodeName(name string) bool { return nodeName.MatchString(name) }

// validate checks the cluster section; bad reports each problem with its key.
func (c *Cluster) validate(bad func(key, format string, args ...any)) {
	if !nodeName.MatchString(c.Name) {
		bad("cluster.name", "%q must be 1-64 characters of a-z, 0-9 and - (not at either end), unique in the cluster", c.Name)
	}
	if c.Advertise != "" {
		checkURL(bad, "cluster.advertise", c.Advertise)
	}
	if c.SecretFile == "" {
		bad("cluster.secretFile", "set the file with the secret the nodes share (at least 32 bytes, mode 600; e.g. head -c 32 /dev/urandom | base64 > secret)")
	}
	e := c.Etcd
	switch {
	case len(e.Endpoints) == 0 && e.Embed == nil:
		bad("cluster.etcd", "set endpoints (an external etcd cluster) or embed (run a member in this node)")
	case len(e.Endpoints) > 0 && e.Embed != nil:
		bad("cluster.etcd", "set endpoints or embed, not both")
	}
	https := false
	for i, ep := range e.Endpoints {
		https = checkURL(bad, fmt.Sprintf("cluster.etcd.endpoints[%d]", i), ep) || https
	}
	if e.Prefix != "" && !strings.HasPrefix(e.Prefix, "/") {
		bad("cluster.etcd.prefix", "%q must start with /", e.Prefix)
	}
	if e.DialTimeout < 0 {
		bad("cluster.etcd.dialTimeout", "must be 0 (5s) or more, got %s", e.DialTimeout)
	}
	e.TLS.validate(bad, "cluster.etcd.tls")
	if m := e.Embed; m != nil {
		https = checkURL(bad, "cluster.etcd.embed.clientURL", m.ClientURL) || https
		if checkURL(bad, "cluster.etcd.embed.peerURL", m.PeerURL) && m.PeerTLS.CertFile == "" {
			bad("cluster.etcd.embed.peerTLS", "an https peerURL needs certFile and keyFile")
		}
		m.PeerTLS.validate(bad, "cluster.etcd.embed.peerTLS")
		if m.Join && m.InitialCluster == "" {
			bad("cluster.etcd.embed.initialCluster", "a joining member needs the cluster's members, itself included (name=peerURL,…)")
		}
		if m.InitialCluster != "" {
			checkInitialCluster(bad, m.InitialCluster, c.Name, m.PeerURL)
		}
		if https && e.TLS.CertFile == "" {
			bad("cluster.etcd.tls", "an https clientURL needs certFile and keyFile (the member serves with them)")
		}
	}
}

// checkURL reports whether u, a valid http or https URL with a host and
// port and nothing else, is https; an invalid one is reported.
func checkURL(bad func(key, format string, args ...any), key, u string) (https bool) {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Port() == "" ||
		p.Hostname() == "" || strings.Trim(p.Path, "/") != "" || p.RawQuery != "" {
		bad(key, "%q must be http://host:port or https://host:port", u)
		return false
	}
	return p.Scheme == "https"
}

func (f TLSFiles) validate(bad func(key, format string, args ...any), key string) {
	if (f.CertFile == "") != (f.KeyFile == "") {
		bad(key, "certFile and keyFile go together")
	}
}

// checkInitialCluster checks name=peerURL,… and that it lists this member
// with its own peerURL.
func checkInitialCluster(bad func(key, format string, args ...any), list, name, peerURL string) {
	const key = "cluster.etcd.embed.initialCluster"
	self := false
	for _, m := range strings.Split(list, ",") {
		n, u, ok := strings.Cut(strings.TrimSpace(m), "=")
		if !ok || !nodeName.MatchString(n) {
			bad(key, "%q is not name=peerURL", m)
			continue
		}
		checkURL(bad, key, u)
		if n == name {
			self = true
			if u != peerURL {
				bad(key, "lists %s at %s, but its peerURL is %s", n, u, peerURL)
			}
		}
	}
	if !self {
		bad(key, "must list this member (%s=%s)", name, peerURL)
	}
}
