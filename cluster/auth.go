package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// AuthHeader carries a node's proof that it knows the cluster secret on
// every request between nodes (payload fetches, forwarded starts).
const AuthHeader = "X-Inferd-Node-Auth"

// maxSkew is how far a signed request's time may be from the receiver's
// clock: a captured header is worth replaying only that long.
const maxSkew = 60 * time.Second

// MinSecretBytes is the shortest cluster secret accepted.
const MinSecretBytes = 32

// ErrUnauthenticated is Verify's error for a request between nodes without
// a valid signature.
var ErrUnauthenticated = errors.New("not signed by a node of this cluster")

// Signer signs and checks requests between the nodes of one cluster with
// their shared secret (cluster.secretFile): an HMAC-SHA256 of the sending
// node's name, the time, the method and the path. The body is not signed;
// run the API over TLS where the network between nodes is not trusted.
type Signer struct {
	node   string
	secret []byte
	now    func() time.Time
}

// NewSigner returns the Signer of node with the given secret.
func NewSigner(node string, secret []byte, now func() time.Time) (*Signer, error) {
	if len(secret) < MinSecretBytes {
		return nil, fmt.Errorf("cluster secret: %d bytes, need at least %d", len(secret), MinSecretBytes)
	}
	if now == nil {
		now = time.Now
	}
	return &Signer{node: node, secret: secret, now: now}, nil
}

// ReadSecret reads a cluster secret file: its content without surrounding
// white space. The file must not be readable by group or others.
func ReadSecret(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cluster secret: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("cluster secret %s: mode %04o lets others read it; chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster secret: %w", err)
	}
	return []byte(strings.TrimSpace(string(b))), nil
}

// Node is the name of the node this Signer signs for.
func (s *Signer) Node() string { return s.node }

// Sign adds the signature header to r.
func (s *Signer) Sign(r *http.Request) {
	ts := strconv.FormatInt(s.now().Unix(), 10)
	r.Header.Set(AuthHeader, s.node+" "+ts+" "+s.mac(s.node, ts, r.Method, r.URL.Path))
}

// Verify checks r's signature and returns the name of the node that sent
// it; a missing, malformed, stale or wrong signature is ErrUnauthenticated.
func (s *Signer) Verify(r *http.Request) (string, error) {
	f := strings.Fields(r.Header.Get(AuthHeader))
	if len(f) != 3 {
		return "", ErrUnauthenticated
	}
	node, ts, sig := f[0], f[1], f[2]
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", ErrUnauthenticated
	}
	if d := s.now().Sub(time.Unix(sec, 0)); d > maxSkew || d < -maxSkew {
		return "", fmt.Errorf("%w: its time is %s off this node's", ErrUnauthenticated, d.Round(time.Second))
	}
	if !hmac.Equal([]byte(sig), []byte(s.mac(node, ts, r.Method, r.URL.Path))) {
		return "", ErrUnauthenticated
	}
	return node, nil
}

func (s *Signer) mac(node, ts, method, path string) string {
	h := hmac.New(sha256.New, s.secret)
	for _, part := range []string{node, ts, method, path} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}
