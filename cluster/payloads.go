package cluster

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"inferd/internal/durable"
	"inferd/store"
	"inferd/store/etcd"
)

// PayloadsPath is where a node serves the payloads it holds, under the
// signed /cluster/v1/ API: GET and PUT PayloadsPath<id>/<kind>, DELETE
// PayloadsPath<id>.
const PayloadsPath = "/cluster/v1/payloads/"

// SHA256Header carries the hex sha256 of a PUT's body: the receiver keeps
// the copy only if the body it read has that digest.
const SHA256Header = "X-Inferd-Payload-Sha256"

// Defaults of PayloadOptions.
const (
	// DefaultMaxPayloadBytes is the largest payload a node holds: the
	// largest model reply the local backend reads (64 MiB), which is over
	// the API's default request body limit (10 MiB).
	DefaultMaxPayloadBytes = 64 << 20
	// DefaultMinFreeBytes is the disk space a PUT from another node must
	// leave free on the payloads' file system.
	DefaultMinFreeBytes = 512 << 20
	// DefaultPeerTimeout bounds each request to another node.
	DefaultPeerTimeout = 15 * time.Second
)

// Peers is what the payload store needs of the cluster's membership
// (*Node has it): the live nodes, and one by name.
type Peers interface {
	Nodes() []NodeInfo
	NodeInfo(name string) (NodeInfo, bool)
}

// PayloadOptions configure OpenPayloads.
type PayloadOptions struct {
	// Dir holds the payloads, one file each: <dataDir>/payloads.
	Dir string
	// Signer signs this node's requests and checks other nodes'; its
	// Node() is this node's name, as the refs in etcd name it.
	Signer *Signer
	// Peers are the live nodes a copy can go to or come from: the *Node.
	// It may be nil here and given by SetPeers before the first Put or
	// Get, as the Node is made after the store it works through.
	Peers Peers
	// Client sends the requests to other nodes; nil means a plain client.
	Client *http.Client
	// MaxBytes is the largest payload kept or accepted from another node;
	// 0 means DefaultMaxPayloadBytes.
	MaxBytes int64
	// MinFreeBytes is the disk space a copy from another node must leave;
	// 0 means DefaultMinFreeBytes.
	MinFreeBytes int64
	// PeerTimeout bounds each request to another node; 0 means
	// DefaultPeerTimeout.
	PeerTimeout time.Duration
	// Log receives the failures nobody waits for (a copy not deleted).
	Log zerolog.Logger
}

// PayloadStore holds the payloads over etcd's inline limit on this node and
// one other (etcd.Payloads): each is a file of Dir, written with fsync
// before Put returns, and copied to another live node by a signed PUT.
// Its ServeHTTP is the other side: the payload API other nodes call.
type PayloadStore struct {
	dir      string
	signer   *Signer
	peersMu  sync.RWMutex
	peers    Peers // nil until SetPeers, when not given
	client   *http.Client
	maxBytes int64
	minFree  int64
	timeout  time.Duration
	log      zerolog.Logger
	// free returns the bytes free for unprivileged use on dir's file
	// system (tests replace it).
	free func(dir string) (int64, error)
}

var _ etcd.Payloads = (*PayloadStore)(nil)

// OpenPayloads makes Dir if needed (mode 0700: payloads are call inputs)
// and removes what interrupted writes left there.
func OpenPayloads(o PayloadOptions) (*PayloadStore, error) {
	if o.Signer == nil || o.Dir == "" {
		return nil, errors.New("open payload store: Dir and Signer are required")
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("open payload store: %w", err)
	}
	leftovers, err := filepath.Glob(filepath.Join(o.Dir, durable.TempPrefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("open payload store: %w", err)
	}
	for _, f := range leftovers {
		if err := os.Remove(f); err != nil {
			return nil, fmt.Errorf("open payload store: remove an interrupted write: %w", err)
		}
	}
	if o.Client == nil {
		// Nodes reach each other directly, never through a proxy named in
		// the environment (as forwarded starts do).
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = nil
		o.Client = &http.Client{Transport: t}
	}
	return &PayloadStore{dir: o.Dir, signer: o.Signer, peers: o.Peers, client: o.Client,
		maxBytes: cmp.Or(max(o.MaxBytes, 0), DefaultMaxPayloadBytes),
		minFree:  cmp.Or(max(o.MinFreeBytes, 0), DefaultMinFreeBytes),
		timeout:  cmp.Or(max(o.PeerTimeout, 0), DefaultPeerTimeout),
		log:      o.Log, free: diskFree}, nil
}

// SetPeers gives the membership the store copies to and fetches from, when
// PayloadOptions had none.
func (p *PayloadStore) SetPeers(peers Peers) {
	p.peersMu.Lock()
	defer p.peersMu.Unlock()
	p.peers = peers
}

// errNoPeers is the error of a Put or Get before SetPeers: whether another
// node is live is not known, so no payload can be made durable.
var errNoPeers = errors.New("cluster membership not started")

func (p *PayloadStore) membership() (Peers, error) {
	p.peersMu.RLock()
	defer p.peersMu.RUnlock()
	if p.peers == nil {
		return nil, errNoPeers
	}
	return p.peers, nil
}

// validPayload checks a payload's id and kind before they name a file or a
// URL: a call id as the scheduler draws them (call_<uuid>), so no path
// separator, dot or escape can reach the file system.
func validPayload(id, kind string) error {
	if kind != etcd.KindInputs && kind != etcd.KindOutputs {
		return fmt.Errorf("payload kind %q: want %s or %s", kind, etcd.KindInputs, etcd.KindOutputs)
	}
	return validID(id)
}

func validID(id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("payload id of %d characters: want 1 to 128", len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("payload id %q: only a-z, A-Z, 0-9, _ and - are allowed", id)
		}
	}
	return nil
}

func (p *PayloadStore) file(id, kind string) string { return filepath.Join(p.dir, id+"."+kind) }

// Put implements etcd.Payloads: b is written here with fsync, then copied
// to one other live node (chosen by the id, so copies spread), trying the
// others in turn if it fails. It returns this node and the one holding the
// copy, or this node alone when it is the only live one. When other nodes
// are live but none took the copy, it fails: one node's death must not
// lose an accepted payload.
func (p *PayloadStore) Put(ctx context.Context, id, kind string, b []byte) ([]string, error) {
	what := fmt.Sprintf("hold %s of %s", kind, id)
	if err := validPayload(id, kind); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if int64(len(b)) > p.maxBytes {
		return nil, fmt.Errorf("%s: %d bytes, over the %d a node holds", what, len(b), p.maxBytes)
	}
	peers, err := p.membership()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	sum := sha256.Sum256(b)
	if err := p.write(id, kind, bytes.NewReader(b), hex.EncodeToString(sum[:])); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	self := p.signer.Node()
	others := p.others(peers, id)
	if len(others) == 0 {
		return []string{self}, nil
	}
	var errs []error
	for _, n := range others {
		err := p.send(ctx, n, id, kind, b, hex.EncodeToString(sum[:]))
		if err == nil {
			return []string{self, n.Name}, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%s: no other node took its copy: %w", what, errors.Join(errs...))
}

// others returns the live nodes but this one that can be reached, starting
// at one chosen by id.
func (p *PayloadStore) others(peers Peers, id string) []NodeInfo {
	var out []NodeInfo
	for _, n := range peers.Nodes() {
		if n.Name != p.signer.Node() && n.Advertise != "" {
			out = append(out, n)
		}
	}
	if len(out) < 2 {
		return out
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	k := int(h.Sum32() % uint32(len(out)))
	return slices.Concat(out[k:], out[:k])
}

// send PUTs one copy to node n.
func (p *PayloadStore) send(ctx context.Context, n NodeInfo, id, kind string, b []byte, sum string) error {
	resp, err := p.request(ctx, http.MethodPut, p.url(n, id, kind), bytes.NewReader(b), sum, http.StatusNoContent)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// request sends a signed request to another node within the peer timeout
// and returns its answer when its status is want; the caller reads and
// closes the body before ctx's end. Any other answer is an error.
func (p *PayloadStore) request(ctx context.Context, method, url string, body io.Reader, sum string, want int) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		cancel()
		return nil, err
	}
	if sum != "" {
		req.Header.Set(SHA256Header, sum)
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	p.signer.Sign(req)
	resp, err := p.client.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != want {
		defer cancel()
		defer resp.Body.Close()
		return nil, refusal(resp)
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

// cancelOnClose ends a request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func (p *PayloadStore) url(n NodeInfo, id, kind string) string {
	u := strings.TrimSuffix(n.Advertise, "/") + PayloadsPath + id
	if kind != "" {
		u += "/" + kind
	}
	return u
}

// refusal is the error of another node's answer other than success, with
// the first line of its body.
func refusal(resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	line, _, _ := strings.Cut(strings.TrimSpace(string(msg)), "\n")
	return fmt.Errorf("answered %s: %s", resp.Status, line)
}

// Get implements etcd.Payloads: the payload from this node's file when it
// holds one, else from each other holder in turn, each copy checked
// against ref's size and sha256; a damaged or missing copy is passed over.
func (p *PayloadStore) Get(ctx context.Context, id, kind string, ref etcd.PayloadRef) ([]byte, error) {
	what := fmt.Sprintf("fetch %s of %s", kind, id)
	if err := validPayload(id, kind); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if ref.Size > p.maxBytes {
		return nil, fmt.Errorf("%s: %d bytes, over the %d a node holds", what, ref.Size, p.maxBytes)
	}
	var errs []error
	for _, name := range ref.Nodes {
		b, err := p.getFrom(ctx, name, id, kind, ref)
		if err == nil {
			return b, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", name, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%s: %w", what, errors.Join(errs...))
}

func (p *PayloadStore) getFrom(ctx context.Context, name, id, kind string, ref etcd.PayloadRef) ([]byte, error) {
	var b []byte
	if name == p.signer.Node() {
		var err error
		if b, err = os.ReadFile(p.file(id, kind)); err != nil {
			return nil, err
		}
	} else {
		peers, err := p.membership()
		if err != nil {
			return nil, err
		}
		n, ok := peers.NodeInfo(name)
		if !ok || n.Advertise == "" {
			return nil, errors.New("not a live node")
		}
		resp, err := p.request(ctx, http.MethodGet, p.url(n, id, kind), nil, "", http.StatusOK)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		// One byte more than the ref says tells a longer copy apart.
		if b, err = io.ReadAll(io.LimitReader(resp.Body, ref.Size+1)); err != nil {
			return nil, err
		}
	}
	if err := ref.Check(b); err != nil {
		return nil, fmt.Errorf("copy refused: %w", err)
	}
	return b, nil
}

// Delete implements etcd.Payloads: this node's files of call id, then the
// copies on the other nodes named that are live, each asked once within
// the peer timeout. A copy on a node not live now stays (docs/cluster.md).
func (p *PayloadStore) Delete(id string, nodes []string) {
	if validID(id) != nil {
		return // never held: Put refuses such ids
	}
	peers, _ := p.membership()
	for _, name := range nodes {
		if name == p.signer.Node() {
			p.remove(id)
			continue
		}
		if peers == nil {
			continue
		}
		n, ok := peers.NodeInfo(name)
		if !ok || n.Advertise == "" {
			continue
		}
		resp, err := p.request(context.Background(), http.MethodDelete, p.url(n, id, ""), nil, "", http.StatusNoContent)
		if err == nil {
			err = resp.Body.Close()
		}
		if err != nil {
			p.log.Warn().Err(err).Str("call", id).Str("node", name).Msg("deleting an expired call's payload copy failed")
		}
	}
}

// remove deletes this node's files of call id; one already gone is fine.
func (p *PayloadStore) remove(id string) {
	for _, kind := range []string{etcd.KindInputs, etcd.KindOutputs} {
		if err := os.Remove(p.file(id, kind)); err != nil && !errors.Is(err, os.ErrNotExist) {
			p.log.Warn().Err(err).Str("call", id).Msg("deleting an expired call's payload file failed")
		}
	}
}

// write stores r as call id's payload of kind: a temporary file, fsynced,
// kept only if its sha256 is sum, renamed into place, and the directory
// fsynced, so a payload Put reported durable survives a crash.
func (p *PayloadStore) write(id, kind string, r io.Reader, sum string) error {
	err := durable.Replace(p.file(id, kind), func(w io.Writer) error {
		h := sha256.New()
		if _, err := io.Copy(io.MultiWriter(w, h), r); err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != sum {
			return &digestError{got: got, want: sum}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write payload: %w", err)
	}
	return nil
}

// digestError is a body whose sha256 is not the one it was sent with.
type digestError struct{ got, want string }

func (e *digestError) Error() string {
	return fmt.Sprintf("body's sha256 is %s, the request says %s", e.got, e.want)
}

// ServeHTTP is the payload API of this node, for other nodes only: every
// request must carry a valid Signer signature (401 otherwise), whatever
// the router in front checks. GET <id>/<kind> answers the payload held
// here (404 when none); PUT <id>/<kind> keeps a copy: at most MaxBytes, its
// SHA256Header required and checked, refused (507) when it would leave
// less than MinFreeBytes of disk; DELETE <id> removes the call's payloads.
// Ids and kinds are checked before they name a file (400).
func (p *PayloadStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, err := p.signer.Verify(r); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, PayloadsPath)
	if !ok {
		http.NotFound(w, r)
		return
	}
	id, kind, _ := strings.Cut(rest, "/")
	var err error
	if r.Method == http.MethodDelete {
		if kind != "" {
			err = errors.New("DELETE takes a call id, not a kind")
		} else {
			err = validID(id)
		}
	} else {
		err = validPayload(id, kind)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch r.Method {
	case http.MethodGet:
		p.serveGet(w, r, id, kind)
	case http.MethodPut:
		p.servePut(w, r, id, kind)
	case http.MethodDelete:
		p.remove(id)
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Allow", "GET, PUT, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func (p *PayloadStore) serveGet(w http.ResponseWriter, r *http.Request, id, kind string) {
	f, err := os.Open(p.file(id, kind))
	if errors.Is(err, os.ErrNotExist) {
		http.Error(w, "no such payload on this node", http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, "read payload: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		http.Error(w, "read payload: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	io.Copy(w, f) // a failure here is the reader's to see: a short body
}

func (p *PayloadStore) servePut(w http.ResponseWriter, r *http.Request, id, kind string) {
	sum := r.Header.Get(SHA256Header)
	if len(sum) != sha256.Size*2 {
		http.Error(w, "missing or malformed "+SHA256Header, http.StatusBadRequest)
		return
	}
	if r.ContentLength > p.maxBytes {
		http.Error(w, fmt.Sprintf("payload of %d bytes, over the %d a node holds", r.ContentLength, p.maxBytes), http.StatusRequestEntityTooLarge)
		return
	}
	need := r.ContentLength
	if need < 0 {
		need = p.maxBytes // length unknown: room for the largest
	}
	free, err := p.free(p.dir)
	if err != nil {
		http.Error(w, "disk space: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if free-need < p.minFree {
		http.Error(w, fmt.Sprintf("not enough disk: %d bytes free, keeping %d free", free, p.minFree), http.StatusInsufficientStorage)
		return
	}
	err = p.write(id, kind, http.MaxBytesReader(w, r.Body, p.maxBytes), sum)
	var tooLarge *http.MaxBytesError
	var de *digestError
	switch {
	case errors.As(err, &tooLarge):
		http.Error(w, fmt.Sprintf("payload over the %d bytes a node holds", p.maxBytes), http.StatusRequestEntityTooLarge)
	case errors.As(err, &de):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// diskFree returns the bytes an unprivileged writer may still use on dir's
// file system.
func diskFree(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// PayloadRefs is what a sweep asks the store (*etcd.Store): the reference
// etcd holds to a call's payload, if any.
type PayloadRefs interface {
	HeldPayload(id, kind string) (etcd.PayloadRef, bool, error)
}

// Sweep removes this node's payload files last written before olderThan
// that no reference in etcd names this node for: those of calls that
// expired while this node was away (Delete never reached it), and those
// held for a write that then failed. olderThan must leave far more time
// than a write takes from its Put to its commit (the store's payload
// timeout and commit retries, under a minute), or a payload being written
// now could look unnamed. It returns how many files it removed.
func (p *PayloadStore) Sweep(refs PayloadRefs, olderThan time.Time) (int, error) {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return 0, fmt.Errorf("sweep payloads: %w", err)
	}
	self := p.signer.Node()
	n := 0
	for _, e := range entries {
		id, kind, ok := strings.Cut(e.Name(), ".")
		if !ok || validPayload(id, kind) != nil || !e.Type().IsRegular() {
			continue // a temporary file (OpenPayloads removes those) or not ours
		}
		if old, err := p.lastWrittenBefore(e.Name(), olderThan); err != nil || !old {
			continue
		}
		ref, named, err := refs.HeldPayload(id, kind)
		if err != nil {
			return n, fmt.Errorf("sweep payloads: %w", err)
		}
		if named && slices.Contains(ref.Nodes, self) {
			continue
		}
		// Looked at again just before: a Put of this very payload since
		// the store was asked replaced the file and made it new.
		if old, err := p.lastWrittenBefore(e.Name(), olderThan); err != nil || !old {
			continue
		}
		if err := os.Remove(filepath.Join(p.dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return n, fmt.Errorf("sweep payloads: %w", err)
		}
		n++
	}
	return n, nil
}

func (p *PayloadStore) lastWrittenBefore(name string, t time.Time) (bool, error) {
	fi, err := os.Stat(filepath.Join(p.dir, name))
	if err != nil {
		return false, err
	}
	return fi.ModTime().Before(t), nil
}

// RunSweeper sweeps every `every` the files older than grace (see Sweep)
// until ctx ends; a failed sweep is logged and tried again next time.
func (p *PayloadStore) RunSweeper(ctx context.Context, refs PayloadRefs, every, grace time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	down := false // etcd unavailable: told once per outage
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := p.Sweep(refs, time.Now().Add(-grace))
		switch {
		case errors.Is(err, store.ErrUnavailable):
			if !down {
				p.log.Warn().Err(err).Msg("sweeping payload files: store unavailable (no quorum?); trying again at every tick until it answers")
			}
			down = true
			continue
		case err != nil:
			p.log.Warn().Err(err).Int("removed", n).Msg("sweeping payload files no call names failed")
		case n > 0:
			p.log.Info().Int("removed", n).Msg("removed payload files no call names")
		}
		if down {
			p.log.Info().Msg("sweeping payload files: store available again")
			down = false
		}
	}
}
