package cluster

import (
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSignerAcceptsItsClusterOnly(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	secret := []byte(strings.Repeat("s", MinSecretBytes))
	a, err := NewSigner("box-1", secret, clock)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewSigner("box-2", secret, clock)
	other, _ := NewSigner("box-2", []byte(strings.Repeat("x", MinSecretBytes)), clock)

	r := httptest.NewRequest("GET", "/cluster/v1/payloads/call_1/inputs", nil)
	a.Sign(r)
	if node, err := b.Verify(r); err != nil || node != "box-1" {
		t.Fatalf("same secret: node %q, err %v; want box-1", node, err)
	}
	if _, err := other.Verify(r); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("other secret: err %v, want ErrUnauthenticated", err)
	}
	moved := httptest.NewRequest("GET", "/cluster/v1/payloads/call_2/inputs", nil)
	moved.Header = r.Header.Clone()
	if _, err := b.Verify(moved); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("signature of another path: err %v, want ErrUnauthenticated", err)
	}
	forged := httptest.NewRequest("GET", r.URL.Path, nil)
	forged.Header.Set(AuthHeader, strings.Replace(r.Header.Get(AuthHeader), "box-1", "box-3", 1))
	if _, err := b.Verify(forged); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("another node's name on box-1's signature: err %v, want ErrUnauthenticated", err)
	}
	if _, err := b.Verify(httptest.NewRequest("GET", r.URL.Path, nil)); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("unsigned: err %v, want ErrUnauthenticated", err)
	}
	now = now.Add(2 * maxSkew)
	if _, err := b.Verify(r); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("replayed after %s: err %v, want ErrUnauthenticated", 2*maxSkew, err)
	}
}

func TestSecretRules(t *testing.T) {
	if _, err := NewSigner("box-1", []byte("short"), nil); err == nil {
		t.Error("a 5-byte secret was accepted")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "secret")
	if err := os.WriteFile(path, []byte(strings.Repeat("k", 40)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSecret(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable secret: err %v, want a chmod hint", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadSecret(path)
	if err != nil || string(got) != strings.Repeat("k", 40) {
		t.Errorf("ReadSecret = %q, %v; want the trimmed secret", got, err)
	}
}
