package etcd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The certificates `inferd cluster init` makes, so that etcd answers
// inferd's nodes alone: every member's client and peer listeners require a
// certificate signed by the cluster's own CA (mutual TLS), which only the
// user inferd runs as can read. One node certificate serves every node, as
// the cluster secret does: it names every host given (and loopback), and
// is good for both sides of each connection (a member serves it, a node
// and a peer present it).

// Names of the files in a cluster's TLS directory.
const (
	CAFile      = "ca.pem"
	CAKeyFile   = "ca-key.pem"
	NodeFile    = "node.pem"
	NodeKeyFile = "node-key.pem"
)

// certLife is how long the certificates made are valid: an appliance's
// cluster should not stop on a forgotten renewal; `cluster init --force`
// issues new node certificates with the same CA.
const certLife = 10 * 365 * 24 * time.Hour

// CertFiles are the files MakeCerts wrote (or kept), as full paths.
type CertFiles struct {
	CA, CAKey, Node, NodeKey string
	CAKept                   bool // the CA was there already and was used again
}

// TLS is the node's TLS files for the etcd client and listeners.
func (f CertFiles) TLS() TLSFiles {
	return TLSFiles{CertFile: f.Node, KeyFile: f.NodeKey, CAFile: f.CA}
}

// MakeCerts writes a cluster's TLS files into dir (made with mode 0700 when
// absent): a CA (kept when dir has one, so certificates issued again stay
// trusted by the members that run), and a node certificate signed by it for
// hosts (IP addresses or DNS names; loopback is always added), every key of
// mode 0600. An existing node certificate is replaced only with force.
func MakeCerts(dir string, hosts []string, force bool, now time.Time) (CertFiles, error) {
	f := CertFiles{CA: filepath.Join(dir, CAFile), CAKey: filepath.Join(dir, CAKeyFile),
		Node: filepath.Join(dir, NodeFile), NodeKey: filepath.Join(dir, NodeKeyFile)}
	if len(hosts) == 0 {
		return f, errors.New("no hosts: name every address or host name the members are reached at")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return f, fmt.Errorf("make %s: %w", dir, err)
	}
	if _, err := os.Stat(f.Node); err == nil && !force {
		return f, fmt.Errorf("%s exists; pass --force to issue a new node certificate (the CA is kept)", f.Node)
	}
	ca, caKey, err := loadCA(f)
	switch {
	case err == nil:
		f.CAKept = true
	case errors.Is(err, os.ErrNotExist):
		if ca, caKey, err = newCA(f, now); err != nil {
			return f, err
		}
	default:
		return f, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, fmt.Errorf("node key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "inferd node", Organization: []string{"inferd"}},
		NotBefore:    now.Add(-time.Hour), // clocks of the boxes agree within a minute (docs/cluster.md)
		NotAfter:     now.Add(certLife),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return f, fmt.Errorf("sign the node certificate: %w", err)
	}
	if err := writeKey(f.NodeKey, key); err != nil {
		return f, err
	}
	return f, writePEM(f.Node, "CERTIFICATE", der, 0o644)
}

// newCA makes and writes the cluster's CA.
func newCA(f CertFiles, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "inferd cluster CA", Organization: []string{"inferd"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certLife),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign the CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("read the CA certificate back: %w", err)
	}
	if err := writeKey(f.CAKey, key); err != nil {
		return nil, nil, err
	}
	if err := writePEM(f.CA, "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	return ca, key, nil
}

// loadCA reads the CA kept in f.CA and f.CAKey; os.ErrNotExist when
// either is absent.
func loadCA(f CertFiles) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(f.CAKey)
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("%s or %s is not PEM", f.CA, f.CAKey)
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", f.CA, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", f.CAKey, err)
	}
	return ca, key, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

// writePEM writes one PEM block to path with mode perm, through a
// temporary file renamed into place, fsynced.
func writePEM(path, kind string, der []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := pem.Encode(tmp, &pem.Block{Type: kind, Bytes: der}); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
