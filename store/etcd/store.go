package etcd

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"inferd/store"
)

// schemaVersion is the key layout this code reads and writes (see doc.go).
const schemaVersion = "2"

// DefaultPrefix is where the records live when Options.Prefix is empty.
const DefaultPrefix = "/inferd/"

// Options configure Open.
type Options struct {
	// Endpoints are the etcd client URLs (http://host:2379). At least one.
	Endpoints []string
	// TLS is the client's TLS configuration for https endpoints; nil for
	// plain http.
	TLS *tls.Config
	// Prefix is put before every key, so one etcd cluster can hold several
	// inferd clusters (or tests). Empty means DefaultPrefix.
	Prefix string
	// Node names this node: the calls it writes are its own to recover
	// (PendingCalls). Stores that share a prefix give different names;
	// "" is a name too (one node, or tests).
	Node string
	// Now stamps Created, Updated, Revoked and a final call's missing
	// Finished. Nil means time.Now.
	Now func() time.Time
	// DialTimeout bounds the first connection; 0 means 5 s.
	DialTimeout time.Duration
	// RequestTimeout bounds each etcd request other than a call write,
	// its tries included (TryTimeout): one still unanswered then fails
	// with store.ErrUnavailable. 0 means 5 s.
	RequestTimeout time.Duration
	// RetryFor bounds a call write (and a webhook delivery update), its
	// tries included, the same way; 0 means 15 s.
	RetryFor time.Duration
	// TryTimeout bounds one try of a request: a try unanswered then (a
	// raft leader change lost it) is sent again, within the request's
	// bound, when sending it again is harmless (retry.go says which
	// are). 0 means DefaultTryTimeout (500 ms).
	TryTimeout time.Duration
	// Payloads holds inputs and outputs over InlineLimit on nodes (cluster
	// mode: package cluster's PayloadStore). Nil keeps every payload in
	// etcd, refusing those over MaxInlinePayload (tests, a single etcd).
	Payloads Payloads
	// PayloadTimeout bounds holding one call write's payloads and fetching
	// one payload; 0 means DefaultPayloadTimeout.
	PayloadTimeout time.Duration
}

// Store is the etcd store.Store. Its methods are safe for concurrent use.
type Store struct {
	cli      *clientv3.Client
	prefix   string
	node     string
	now      func() time.Time
	reqTO    time.Duration // a request's bound, its tries included
	retryFor time.Duration // a call write's
	tryTO    time.Duration // one try's

	ops opCounter // what it asks of etcd (opcount.go)

	payloads  Payloads // nil: every payload inline
	payloadTO time.Duration
	holders   sync.WaitGroup // the goroutines of hold

	hooks         store.ProjectHooks
	teamHooks     store.TeamHooks
	deliveryHooks store.DeliveryHooks
	// Calls made final through any node, told to OnCallFinal's hooks.
	finals finalWatch

	// Other nodes' project and team writes, told to the hooks.
	projectWatch, teamWatch keyWatch
	// Outbox records the leader handed to this node (assign.go).
	outboxWatch keyWatch

	// Concurrent reads of one key share a request (get), and concurrent
	// starts of one key and modelKey their lookup (LookupStart).
	reads   sharedReads[*clientv3.GetResponse]
	lookups sharedReads[*clientv3.TxnResponse]
	// projectHint is the project each modelKey's index entry last named
	// (modelKey hash → project id), read with the index by LookupStart.
	projectHint sync.Map
	// keyRecords and projectRecords are the key and project records the
	// hot reads (Authenticate, LookupStart) decoded last (decoded.go).
	keyRecords     decodedCache[store.APIKey]
	projectRecords decodedCache[store.Project]

	// unanswered is when a try first failed for want of an answer since
	// the last one answered (Unix nanoseconds), 0 while etcd answers
	// (see down).
	unanswered atomic.Int64
	closed     atomic.Bool
	once       sync.Once
	w          writer
	stats      commitStats
	fence      leases // the lease each call's writes are fenced on (fence.go)
}

var _ store.Store = (*Store)(nil)

// Open connects to etcd and returns the store. It fails when no endpoint
// answers within the dial timeout, or when the prefix holds records of
// another layout version. Close ends its writer and its connection.
func Open(opts Options) (*Store, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("open etcd store: no endpoints")
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if !strings.HasSuffix(opts.Prefix, "/") {
		opts.Prefix += "/"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 5 * time.Second
	}
	if opts.RetryFor <= 0 {
		opts.RetryFor = 15 * time.Second
	}
	if opts.TryTimeout <= 0 {
		opts.TryTimeout = DefaultTryTimeout
	}
	if opts.PayloadTimeout <= 0 {
		opts.PayloadTimeout = DefaultPayloadTimeout
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   opts.Endpoints,
		TLS:         opts.TLS,
		DialTimeout: opts.DialTimeout,
		// The client logs every retry and reconnect; the errors that
		// matter come back to our callers, who report them once.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("open etcd store at %s: %w", strings.Join(opts.Endpoints, ","), err)
	}
	s := &Store{cli: cli, prefix: opts.Prefix, node: opts.Node, now: opts.Now, reqTO: opts.RequestTimeout, retryFor: opts.RetryFor,
		tryTO:    opts.TryTimeout,
		payloads: opts.Payloads, payloadTO: opts.PayloadTimeout}
	cli.KV = countingKV{KV: cli.KV, n: &s.ops} // before any request: every one is counted
	rev, err := s.checkSchema(opts.DialTimeout)
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("open etcd store at %s: %w", strings.Join(opts.Endpoints, ","), err)
	}
	s.w.start(s)
	s.startWatches(rev + 1)
	s.finals.start(s, rev+1)
	return s, nil
}

// checkSchema writes the layout version into an empty prefix, or checks the
// one there, and returns the revision it read at.
func (s *Store) checkSchema(timeout time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	k := s.key("schema")
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, schemaVersion)).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return 0, fmt.Errorf("etcd unreachable: %w", err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 1 && string(kvs[0].Value) == schemaVersion {
		return resp.Header.Revision, nil
	}
	got := ""
	if len(kvs) == 1 {
		got = string(kvs[0].Value)
	}
	return 0, fmt.Errorf("prefix %s holds layout version %q; this inferd reads version %s", s.prefix, got, schemaVersion)
}

// Close finishes the call writes queued before it, then closes the
// connection. Later calls of any method return store.ErrClosed.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		s.w.stop() // waits for the payloads its queued writes hold
		s.holders.Wait()
		s.finals.stop()
		s.projectWatch.stop()
		s.teamWatch.stop()
		s.outboxWatch.stop()
		s.cli.Close()
	})
	return nil
}

// RunSweeper deletes the finished calls older than ttl every `every` until
// ctx ends. Every node of a cluster may run it: its deletes compare each
// call's revision, so two sweepers never delete a call that changed.
// Without quorum it tries again at the next tick (told to outages).
func (s *Store) RunSweeper(ctx context.Context, ttl, every time.Duration, outages store.Outages) error {
	return store.RunSweeper(ctx, s, s.now, ttl, every, outages)
}

// Size returns the size of the etcd database as its first reachable
// endpoint reports it, or 0 when none answers: a metrics gauge.
func (s *Store) Size() int64 {
	if s.closed.Load() {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.reqTO)
	defer cancel()
	for _, ep := range s.cli.Endpoints() {
		if st, err := s.cli.Status(ctx, ep); err == nil {
			return st.DbSize
		}
	}
	return 0
}

func (s *Store) key(parts ...string) string { return s.prefix + strings.Join(parts, "/") }

// ctx returns the context of one etcd request: its whole bound, each of
// its tries bounded within it by retry.
func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.reqTO)
}

// check fails with store.ErrClosed after Close; what names the operation.
func (s *Store) check(what string) error {
	if s.closed.Load() {
		return fmt.Errorf("%s: %w", what, store.ErrClosed)
	}
	return nil
}

// wrap gives an etcd error its context and the store's sentinel where one
// applies: a full etcd database is store.ErrStorageFull, etcd not answering
// within the request's bound, its tries included (no leader, no reachable
// member: quorum lost or this node cut off) is store.ErrUnavailable, and any failure after
// Close is store.ErrClosed.
func (s *Store) wrap(what string, err error) error {
	switch {
	case s.closed.Load():
		return fmt.Errorf("%s: %w", what, store.ErrClosed)
	case errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace) ||
		strings.Contains(err.Error(), rpctypes.ErrGRPCNoSpace.Error()):
		return fmt.Errorf("%s: etcd database space exceeded (%v): %w", what, err, store.ErrStorageFull)
	case retryable(err):
		return fmt.Errorf("%s: etcd: %w: %w", what, err, store.ErrUnavailable)
	default:
		return fmt.Errorf("%s: etcd: %w", what, err)
	}
}

// get reads one key; ok is false when it is absent.
func (s *Store) get(what, key string) (value []byte, rev int64, ok bool, err error) {
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.reads.get(ctx, key, func(ctx context.Context) (*clientv3.GetResponse, error) { return s.rangeOf(ctx, key) })
	if err != nil {
		return nil, 0, false, s.wrap(what, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, false, nil
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, true, nil
}

// getRecord reads and decodes the record at key, or fails with
// store.ErrNotFound (or store.ErrClosed after Close); what names the
// operation in errors.
func getRecord[T any](s *Store, what, key string) (T, error) {
	var zero T
	if err := s.check(what); err != nil {
		return zero, err
	}
	raw, _, ok, err := s.get(what, key)
	if err != nil {
		return zero, err
	}
	if !ok {
		return zero, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	return decode[T](what, key, raw)
}

// decode unmarshals a stored record; a record that does not decode is
// reported, never skipped.
func decode[T any](what, key string, raw []byte) (T, error) {
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("%s: record %s does not decode: %w", what, key, err)
	}
	return v, nil
}

// encode marshals a record (a call's are written by store.AppendRecord:
// callOps); the error says which record.
func encode(what string, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("%s: encode: %w", what, err)
	}
	return string(b), nil
}

// Client is the etcd client the store talks through; cluster mode's
// membership and election (package cluster) share it.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Prefix is the key prefix every record is under, ending in "/".
func (s *Store) Prefix() string { return s.prefix }
