package etcd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A member whose client listener serves TLS and requires client
// certificates (cluster.etcd.tls with a CA) is reached by a store that
// presents one, and refuses a store that presents none.
func TestMutualTLSBetweenStoreAndMember(t *testing.T) {
	dir := t.TempDir()
	files := writeTestPKI(t, dir)
	m, err := StartMember(MemberConfig{
		Name: "tls", DataDir: filepath.Join(dir, "etcd"),
		PeerURL: "http://" + freeAddr(t), ClientURL: "https://" + freeAddr(t),
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

// writeTestPKI writes a CA and one certificate signed by it, good for
// server and client use on 127.0.0.1, and returns the files.
func writeTestPKI(t *testing.T, dir string) TLSFiles {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := TLSFiles{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "node.pem"), KeyFile: filepath.Join(dir, "node-key.pem")}
	for path, block := range map[string]*pem.Block{
		f.CAFile:   {Type: "CERTIFICATE", Bytes: caDER},
		f.CertFile: {Type: "CERTIFICATE", Bytes: leafDER},
		f.KeyFile:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
