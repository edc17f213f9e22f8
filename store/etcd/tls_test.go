package etcd

import (
	"path/filepath"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/internal/testpki"
)

// A member whose client listener serves TLS and requires client
// certificates (cluster.etcd.tls with a CA) is reached by a store that
// presents one, and refuses a store that presents none.
func TestMutualTLSBetweenStoreAndMember(t *testing.T) {
	dir := t.TempDir()
	files := TLSFiles(testpki.Write(t, dir))
	m, err := StartMember(MemberConfig{
		Name: "tls", DataDir: filepath.Join(dir, "etcd"),
		PeerURL: "http://" + testenv.FreeAddr(t), ClientURL: "https://" + testenv.FreeAddr(t),
		ClientTLS: files, HeartbeatMs: 10, ElectionMs: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })

	cfg, err := ClientTLS(files)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Endpoints: m.ClientURLs(), TLS: cfg})
	if err != nil {
		t.Fatalf("Open with the client certificate: %v", err)
	}
	defer s.Close()
	if _, err := s.EnsureTeam("acme"); err != nil {
		t.Fatalf("EnsureTeam over TLS: %v", err)
	}

	anon, err := ClientTLS(TLSFiles{CAFile: files.CAFile}) // trusts the server, presents nothing
	if err != nil {
		t.Fatal(err)
	}
	if s, err := Open(Options{Endpoints: m.ClientURLs(), TLS: anon, DialTimeout: time.Second}); err == nil {
		s.Close()
		t.Error("Open without a client certificate succeeded; the member must require one")
	}
}
