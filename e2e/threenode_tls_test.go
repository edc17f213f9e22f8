//go:build cluster

package e2e

// etcd is inferd's alone (#42): with the certificates `inferd cluster init`
// makes, etcd answers the nodes, which present the cluster's certificate,
// and nobody else: not a process on the box without it, not a model of a
// project with `network: host`.

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// readEtcd posts a range of the whole keyspace to an etcd client URL's
// JSON gateway with client and answers the body, or an error.
func readEtcd(client *http.Client, url string) (string, error) {
	resp, err := client.Post(url+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"AA==","range_end":"AA=="}`))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), &httpStatusError{resp.StatusCode}
	}
	return string(b), nil
}

type httpStatusError struct{ code int }

func (e *httpStatusError) Error() string { return http.StatusText(e.code) }

// Issue 42, "Done when" 3: three nodes on etcd with `cluster init`'s
// certificates serve as ever (keys, projects and calls across nodes,
// `cluster status`). A project's secret (its env) is in etcd, readable
// with the node certificate; a host process without it (plain HTTP, or
// TLS presenting no certificate) and a model with `network: host`, under
// its own uid (which cannot read the certificate's key either), read
// nothing.
//
// The same cluster shows a key's rate held across the nodes (issue 42,
// "Done when" 4): with limits.burst 30 (and a rate that does not refill
// within the test), 36 starts with one key, twelve through each node, get
// 30 past the rate in all: each node allows its part (ten), not the
// whole burst.
func TestThreeNodeClusterEtcdAnswersOnlyItsNodes(t *testing.T) {
	testenv.NeedRoot(t, "models under uids of their own")
	c := newThreeNodes(t, clusterOpts{tls: true, ownUIDs: true, extra: "limits:\n  requestsPerSecond: 0.001\n  burst: 30\n"})
	n1 := c.nodes[0]
	spyKey := n1.d.createKey("acme", false)
	n1.d.createKey("beta", false)
	models := hostileDir(t)
	victimMark := marker()
	n1.d.apply("projects:\n" +
		hostileProject("spy", "acme", "mk-spy", models, marker(), "    network: host\n") +
		hostileProject("victim", "beta", "mk-victim", models, victimMark, ""))
	secret := "beta-" + victimMark // the victim's SECRET_OF, in its project's env

	if out, err := n1.d.cli("cluster", "status"); err != nil {
		t.Errorf("cluster status over TLS: %v\n%s", err, out)
	}

	t.Run("the node certificate reads etcd", func(t *testing.T) {
		cert, err := tls.LoadX509KeyPair(filepath.Join(c.tlsDir, "node.pem"), filepath.Join(c.tlsDir, "node-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		ca, err := os.ReadFile(filepath.Join(c.tlsDir, "ca.pem"))
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		node := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}}}
		body, err := readEtcd(node, n1.etcdURL)
		if err != nil {
			t.Fatalf("a range with the node certificate: %v %s", err, body)
		}
		// The gateway answers values in base64: the secret is there.
		if !strings.Contains(decodedValues(body), secret) {
			t.Errorf("the victim's secret is not in etcd's keyspace as the node certificate reads it; the checks below would stand for nothing")
		}
	})

	for _, n := range c.nodes {
		t.Run("a host process without the certificate, "+n.name, func(t *testing.T) {
			plain := &http.Client{Timeout: 5 * time.Second}
			if body, err := readEtcd(plain, "http"+strings.TrimPrefix(n.etcdURL, "https")); err == nil || strings.Contains(decodedValues(body), secret) {
				t.Errorf("plain HTTP to %s's etcd: %v %.200s; want nothing", n.name, err, body)
			}
			anon := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			if body, err := readEtcd(anon, n.etcdURL); err == nil || strings.Contains(decodedValues(body), secret) {
				t.Errorf("TLS without a client certificate to %s's etcd: %v %.200s; want nothing", n.name, err, body)
			}
		})
	}

	t.Run("a key's rate holds across the nodes", func(t *testing.T) { keyRateAcrossNodes(t, c) })

	t.Run("a model with network: host", func(t *testing.T) {
		spy := n1.client(t, spyKey)
		for _, n := range c.nodes {
			for _, url := range []string{n.etcdURL, "http" + strings.TrimPrefix(n.etcdURL, "https")} {
				got := ask(t, spy, "mk-spy", map[string]any{"etcdRange": url, "readFile": filepath.Join(c.tlsDir, "node-key.pem")})
				if uid, _ := got["uid"].(float64); uid == 0 {
					t.Fatalf("the spy runs as root: %v", got)
				}
				if body, _ := got["etcd"].(string); !strings.HasPrefix(body, "error:") || strings.Contains(decodedValues(body), secret) {
					t.Errorf("the spy read %s: %.200s", url, body)
				}
				if key, _ := got["file"].(string); !strings.HasPrefix(key, "error:") {
					t.Errorf("the spy read the node certificate's key: %.40s", key)
				}
			}
		}
	})
}

// keyRateAcrossNodes sends twelve starts through each node with a fresh
// key and counts those that got past the key's rate (an unknown modelKey
// answers them: the key was good): the nodes together allow the key's
// burst, 30.
func keyRateAcrossNodes(t *testing.T, c *threeNodes) {
	for _, n := range c.nodes {
		eventually(t, time.Minute, n.name+" seeing the three nodes", func() bool {
			return n.d.metric(t, fmt.Sprintf(`inferd_cluster_nodes{node=%q}`, n.name)) == "3"
		})
	}
	key := c.nodes[0].d.createKey("acme", false)
	passed := 0
	for _, n := range c.nodes {
		for range 12 {
			r, err := n.client(t, key).tryStart("mk-none", `{}`, false)
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := r["message"].(string)
			switch {
			case strings.Contains(msg, "rate limit exceeded"):
			case msg == "error: unknown modelKey":
				passed++
			default:
				t.Errorf("a start through %s: %v", n.name, r)
			}
		}
	}
	if passed != 30 {
		t.Errorf("%d of 36 starts through three nodes got past a key's rate with a burst of 30; want 30", passed)
	}
}

// decodedValues is a range answer of etcd's JSON gateway with each base64
// key and value decoded, so a secret is found whatever the encoding.
func decodedValues(body string) string {
	var out strings.Builder
	for _, f := range strings.FieldsFunc(body, func(r rune) bool { return r == '"' }) {
		if b, err := base64.StdEncoding.DecodeString(f); err == nil {
			out.Write(b)
			out.WriteByte(' ')
		}
	}
	return out.String()
}
