package etcd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// InlineLimit is the most bytes of inputs, and of outputs, a call keeps in
// etcd when the store has Options.Payloads: a larger payload is held on
// nodes and etcd holds only where (payloads/<id>/<kind>, a PayloadRef). It
// is well under MaxInlinePayload so that etcd's database, which keeps old
// revisions until compaction, grows by little per call.
const InlineLimit = 64 << 10

// The kinds of payload a call has, as Payloads and the payloads/ keys name them.
const (
	KindInputs  = "inputs"
	KindOutputs = "outputs"
)

// DefaultPayloadTimeout bounds holding a payload (Put) or fetching one
// (Get) when Options.PayloadTimeout is 0.
const DefaultPayloadTimeout = 30 * time.Second

// Payloads keeps the payloads over InlineLimit on nodes (package cluster's
// PayloadStore). The store calls Put before the call write that names the
// payload is committed, so a committed PayloadRef always names copies that
// were durable when it was written.
type Payloads interface {
	// Put makes b durable as call id's payload of kind and returns the
	// nodes that hold it.
	Put(ctx context.Context, id, kind string, b []byte) (nodes []string, err error)
	// Get returns call id's payload of kind from one of ref.Nodes, trying
	// each in turn; a copy whose size or sha256 is not ref's is refused.
	Get(ctx context.Context, id, kind string, ref PayloadRef) ([]byte, error)
	// Delete removes call id's payloads from nodes, as far as it can: the
	// call has expired, so no read will ask for them again.
	Delete(id string, nodes []string)
}

// PayloadRef is what etcd holds of a payload held on nodes, at
// payloads/<id>/<kind>.
type PayloadRef struct {
	Size   int64    `json:"size"`
	SHA256 string   `json:"sha256"` // hex
	Nodes  []string `json:"nodes"`
}

// RefOf returns the size and digest of b, without nodes.
func RefOf(b []byte) PayloadRef {
	sum := sha256.Sum256(b)
	return PayloadRef{Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:])}
}

// Check reports whether b is the payload ref describes.
func (ref PayloadRef) Check(b []byte) error {
	if int64(len(b)) != ref.Size {
		return fmt.Errorf("%d bytes, want %d", len(b), ref.Size)
	}
	if got := RefOf(b).SHA256; got != ref.SHA256 {
		return fmt.Errorf("sha256 %s, want %s", got, ref.SHA256)
	}
	return nil
}

// heldPayloads is the part of a call write that is held on nodes: Put runs
// in a goroutine of its own (hold) while the write waits in the writer's
// queue, and ready is closed when it is done. The writer takes the write
// only then; until then it also holds back the later writes of the same
// call, so a call's writes still commit in the order queued.
type heldPayloads struct {
	id        string
	in, out   []byte // the payloads to hold; dropped once held
	ready     chan struct{}
	err       error         // set before ready is closed
	inOps     []clientv3.Op // the inputs' PayloadRef put, set before ready is closed
	outOps    []clientv3.Op // the outputs'
	nOps      int           // how many ops hold adds: one per payload
	refsBytes int           // about the size of those ops
}

func (h *heldPayloads) isReady() bool {
	select {
	case <-h.ready:
		return true
	default:
		return false
	}
}

// holdLarge prepares the write of c's payloads over InlineLimit when the
// store holds payloads on nodes: it returns nil when there are none. The
// returned heldPayloads is started by hold.
func (s *Store) holdLarge(id string, in, out []byte) *heldPayloads {
	if s.payloads == nil || (len(in) <= InlineLimit && len(out) <= InlineLimit) {
		return nil
	}
	h := &heldPayloads{id: id, ready: make(chan struct{})}
	if len(in) > InlineLimit {
		h.in = in
		h.nOps++
	}
	if len(out) > InlineLimit {
		h.out = out
		h.nOps++
	}
	h.refsBytes = h.nOps * (256 + len(id))
	return h
}

// hold puts h's payloads on nodes in a goroutine the store tracks, then
// wakes the writer. The goroutine ends within the payload timeout.
func (s *Store) hold(h *heldPayloads) {
	s.holders.Add(1)
	go func() {
		defer s.holders.Done()
		defer s.w.wake()
		defer close(h.ready)
		ctx, cancel := context.WithTimeout(context.Background(), s.payloadTO)
		defer cancel()
		for _, p := range []struct {
			kind string
			b    []byte
			ops  *[]clientv3.Op
		}{{KindInputs, h.in, &h.inOps}, {KindOutputs, h.out, &h.outOps}} {
			if p.b == nil {
				continue
			}
			nodes, err := s.payloads.Put(ctx, h.id, p.kind, p.b)
			if err != nil {
				h.err = fmt.Errorf("save call %s: hold its %s (%d bytes) on nodes: %w", h.id, p.kind, len(p.b), err)
				return
			}
			ref := RefOf(p.b)
			ref.Nodes = nodes
			v, err := json.Marshal(ref)
			if err != nil {
				h.err = fmt.Errorf("save call %s: encode %s ref: %w", h.id, p.kind, err)
				return
			}
			*p.ops = []clientv3.Op{clientv3.OpPut(s.key("payloads", h.id, p.kind), string(v))}
		}
		h.in, h.out = nil, nil
	}()
}

// inputOps returns the operations that store inputs in etcd, or only
// their size when they are held on nodes (their ref is put by hold).
func (s *Store) inputOps(id string, in []byte) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpPut(s.key("inputsize", id), strconv.Itoa(len(in)))}
	switch {
	case s.payloads == nil:
		return append(ops, clientv3.OpPut(s.key("inputs", id), string(in)))
	case len(in) > InlineLimit:
		return append(ops, clientv3.OpDelete(s.key("inputs", id)))
	default:
		// Inline now: a ref an earlier write left would shadow them.
		return append(ops, clientv3.OpPut(s.key("inputs", id), string(in)), clientv3.OpDelete(s.key("payloads", id, KindInputs)))
	}
}

// outputOps returns the operations that store the outputs a write says in
// etcd: put inline, deleted when there are none, or (held on nodes) only
// the inline key deleted, hold puts the ref. A store with Payloads also
// deletes the ref of an earlier write's held outputs.
func (s *Store) outputOps(id string, out []byte) []clientv3.Op {
	inline := clientv3.OpDelete(s.key("outputs", id))
	if len(out) > 0 && (s.payloads == nil || len(out) <= InlineLimit) {
		inline = clientv3.OpPut(s.key("outputs", id), string(out))
	}
	if s.payloads == nil {
		return []clientv3.Op{inline}
	}
	if len(out) > InlineLimit {
		return []clientv3.Op{inline}
	}
	return []clientv3.Op{inline, clientv3.OpDelete(s.key("payloads", id, KindOutputs))}
}

// resolve returns the payload a read found: the inline value, or, when a
// PayloadRef was found instead, the payload fetched from its holders. held
// is the response of the ref's get.
func (s *Store) resolve(what, id, kind string, inline json.RawMessage, held *etcdserverpb.ResponseOp) (json.RawMessage, error) {
	kvs := held.GetResponseRange().Kvs
	if len(kvs) == 0 {
		return inline, nil
	}
	ref, err := decode[PayloadRef](what, string(kvs[0].Key), kvs[0].Value)
	if err != nil {
		return nil, err
	}
	if s.payloads == nil {
		return nil, fmt.Errorf("%s: %w", what, &store.PayloadUnreachableError{Kind: kind, Nodes: ref.Nodes,
			Err: errors.New("this node keeps no payloads (the store has no Options.Payloads)")})
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.payloadTO)
	defer cancel()
	b, err := s.payloads.Get(ctx, id, kind, ref)
	if err == nil {
		// Whatever Get checked, the bytes handed on are the ones etcd names.
		err = ref.Check(b)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, &store.PayloadUnreachableError{Kind: kind, Nodes: ref.Nodes, Err: err})
	}
	if len(b) == 0 {
		return nil, nil
	}
	return b, nil
}

// heldNodes returns the nodes that hold a call's payloads, from the gets of
// its payloads/<id>/ keys, each node once.
func heldNodes(what string, kvs []*mvccpb.KeyValue) ([]string, error) {
	var nodes []string
	for _, kv := range kvs {
		ref, err := decode[PayloadRef](what, string(kv.Key), kv.Value)
		if err != nil {
			return nil, err
		}
		for _, n := range ref.Nodes {
			if !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
	}
	return nodes, nil
}

// HeldPayload returns the reference etcd holds to call id's payload of kind
// held on nodes; ok is false when there is none: the call's payload is
// inline, the call expired, or the write that would have named it never
// committed. A node's payload sweep (package cluster) asks it of its files.
func (s *Store) HeldPayload(id, kind string) (ref PayloadRef, ok bool, err error) {
	what := fmt.Sprintf("held payload %s of %s", kind, id)
	if err := s.check(what); err != nil {
		return PayloadRef{}, false, err
	}
	k := s.key("payloads", id, kind)
	raw, _, ok, err := s.get(what, k)
	if err != nil || !ok {
		return PayloadRef{}, false, err
	}
	ref, err = decode[PayloadRef](what, k, raw)
	return ref, err == nil, err
}
