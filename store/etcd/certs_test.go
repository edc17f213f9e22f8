package etcd

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// The files `cluster init` makes (MakeCerts) make a member answer inferd's
// nodes alone: a store presenting the node certificate reads and writes;
// a client that presents none, or speaks plain HTTP to the client URL (as
// any local process could before), gets nothing. Issued again with
// --force, the node certificate is signed by the same CA, so a member
// running with the old one trusts the new.
func TestClusterInitCertsLetOnlyNodesIntoEtcd(t *testing.T) {
	dir := t.TempDir()
	files, err := MakeCerts(filepath.Join(dir, "tls"), []string{"127.0.0.1"}, false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{files.CAKey: 0o600, files.NodeKey: 0o600, files.CA: 0o644, files.Node: 0o644} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want mode %04o", path, fi.Mode().Perm(), err, want)
		}
	}
	clientAddr := testenv.FreeAddr(t)
	m, err := StartMember(MemberConfig{
		Name: "tls", DataDir: filepath.Join(dir, "etcd"),
		PeerURL: "https://" + testenv.FreeAddr(t), ClientURL: "https://" + clientAddr,
		ClientTLS: files.TLS(), PeerTLS: files.TLS(), HeartbeatMs: 10, ElectionMs: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })

	open := func(f TLSFiles) (*Store, error) {
		cfg, err := ClientTLS(f)
		if err != nil {
			t.Fatal(err)
		}
		return Open(Options{Endpoints: m.ClientURLs(), TLS: cfg, DialTimeout: time.Second})
	}
	s, err := open(files.TLS())
	if err != nil {
		t.Fatalf("Open with the node certificate: %v", err)
	}
	defer s.Close()
	if _, err := s.EnsureTeam("acme"); err != nil {
		t.Fatalf("EnsureTeam with the node certificate: %v", err)
	}

	t.Run("no client certificate", func(t *testing.T) {
		if s, err := open(TLSFiles{CAFile: files.CA}); err == nil {
			s.Close()
			t.Error("Open without a client certificate succeeded")
		}
	})
	t.Run("plain HTTP to the client URL", func(t *testing.T) {
		resp, err := http.Post("http://"+clientAddr+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"AA==","range_end":"AA=="}`))
		if err == nil {
			defer resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("plain HTTP read the keyspace: HTTP %d", resp.StatusCode)
			}
		}
	})
	t.Run("a node certificate issued again", func(t *testing.T) {
		if _, err := MakeCerts(filepath.Join(dir, "tls"), []string{"127.0.0.1"}, false, time.Now()); err == nil {
			t.Error("MakeCerts replaced a node certificate without force")
		}
		again, err := MakeCerts(filepath.Join(dir, "tls"), []string{"127.0.0.1", "box-2"}, true, time.Now())
		if err != nil || !again.CAKept {
			t.Fatalf("MakeCerts with force = %+v, %v; want the CA kept", again, err)
		}
		s2, err := open(again.TLS())
		if err != nil {
			t.Fatalf("Open with the new node certificate: %v", err)
		}
		defer s2.Close()
		if _, err := s2.EnsureTeam("acme"); err != nil {
			t.Errorf("EnsureTeam with the new node certificate: %v", err)
		}
	})
}
