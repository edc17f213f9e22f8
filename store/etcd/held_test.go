package etcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
	"inferd/store/storetest"
)

// fakePayloads holds payloads in memory as nodes "a" and "b" would. A call
// id in block has its Put wait until the channel is closed; fail makes Get
// fail (all holders gone) and corrupt makes it answer other bytes.
type fakePayloads struct {
	mu      sync.Mutex
	held    map[string][]byte // id/kind
	puts    []string          // id/kind, in order
	deleted map[string][]string
	block   map[string]chan struct{}
	putErr  error
	fail    bool
	corrupt bool
}

func newFakePayloads() *fakePayloads {
	return &fakePayloads{held: map[string][]byte{}, deleted: map[string][]string{}, block: map[string]chan struct{}{}}
}

func (f *fakePayloads) Put(ctx context.Context, id, kind string, b []byte) ([]string, error) {
	f.mu.Lock()
	wait, err := f.block[id], f.putErr
	f.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held[id+"/"+kind] = bytes.Clone(b)
	f.puts = append(f.puts, id+"/"+kind)
	return []string{"a", "b"}, nil
}

func (f *fakePayloads) Get(ctx context.Context, id, kind string, ref PayloadRef) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.held[id+"/"+kind]
	switch {
	case f.fail || !ok:
		return nil, fmt.Errorf("holders %v: connection refused", ref.Nodes)
	case f.corrupt:
		return bytes.Repeat([]byte("x"), len(b)), nil
	}
	return b, nil
}

func (f *fakePayloads) Delete(id string, nodes []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted[id] = nodes
	delete(f.held, id+"/"+KindInputs)
	delete(f.held, id+"/"+KindOutputs)
}

func (f *fakePayloads) putsSoFar() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.puts)
}

// jsonOf returns a JSON string value of n bytes in all.
func jsonOf(n int, c string) []byte { return []byte(`"` + strings.Repeat(c, n-2) + `"`) }

// The contract suite holds with payloads held on nodes too.
func TestContractWithPayloadsHeldOnNodes(t *testing.T) {
	m := startMember(t, t.TempDir())
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T, now func() time.Time) func() store.Store {
		prefix := fmt.Sprintf("/contract-held-%d/", n.Add(1))
		p := newFakePayloads()
		return func() store.Store {
			return openStore(t, m, Options{Prefix: prefix, Now: now, Payloads: p})
		}
	})
}

// Inputs and outputs over InlineLimit go to Payloads, not etcd: etcd holds
// their size, digest and holders; every read gives the bytes back. Those at
// the limit stay inline and Payloads never sees them. Sizes over the old
// 512 KiB refusal are kept too.
func TestPayloadsOverInlineLimitAreHeldOnNodes(t *testing.T) {
	m := startMember(t, t.TempDir())
	p := newFakePayloads()
	s := openStore(t, m, Options{Payloads: p})
	defer s.Close()
	ctx := context.Background()

	small := jsonOf(InlineLimit, "s")
	big := jsonOf(MaxInlinePayload+1, "b")
	out := jsonOf(InlineLimit+1, "o")
	if err := s.SaveCall(ctx, store.Call{ID: "call_small", State: store.CallSucceeded, Inputs: small, Outputs: small}); err != nil {
		t.Fatal(err)
	}
	c := store.Call{ID: "call_big", State: store.CallQueued, Inputs: big, Created: time.Now()}
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatalf("SaveCall with inputs of %d bytes: %v", len(big), err)
	}
	c.State, c.Inputs = store.CallRunning, nil
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	c.State, c.Outputs = store.CallSucceeded, out
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got, want := p.putsSoFar(), []string{"call_big/inputs", "call_big/outputs"}; !slices.Equal(got, want) {
		t.Errorf("Payloads.Put of %v, want %v: only payloads over the inline limit, each once", got, want)
	}

	if in, err := s.CallInputs("call_big"); err != nil || !bytes.Equal(in, big) {
		t.Errorf("CallInputs = %d bytes, %v; want the %d given", len(in), err, len(big))
	}
	r, err := s.GetCallResult("call_big")
	if err != nil || !bytes.Equal(r.Outputs, out) || r.InputBytes != int64(len(big)) || r.State != store.CallSucceeded {
		t.Errorf("GetCallResult = %s, %d bytes out, InputBytes %d, %v; want succeeded, %d, %d", r.State, len(r.Outputs), r.InputBytes, err, len(out), len(big))
	}
	if g, err := s.GetCall("call_big"); err != nil || !bytes.Equal(g.Inputs, big) || !bytes.Equal(g.Outputs, out) {
		t.Errorf("GetCall = %d, %d bytes, %v; want both payloads", len(g.Inputs), len(g.Outputs), err)
	}
	if g, err := s.GetCall("call_small"); err != nil || !bytes.Equal(g.Inputs, small) || !bytes.Equal(g.Outputs, small) {
		t.Errorf("GetCall of the inline call = %d, %d bytes, %v", len(g.Inputs), len(g.Outputs), err)
	}

	// What etcd holds: the ref, not the bytes.
	raw, _, ok, err := s.get("read ref", s.key("payloads", "call_big", KindInputs))
	if err != nil || !ok {
		t.Fatalf("payloads/call_big/inputs: %v, present %v", err, ok)
	}
	ref, err := decode[PayloadRef]("ref", "payloads/call_big/inputs", raw)
	if want := RefOf(big); err != nil || ref.Size != want.Size || ref.SHA256 != want.SHA256 || !slices.Equal(ref.Nodes, []string{"a", "b"}) {
		t.Errorf("inputs ref = %+v, %v; want size %d, sha256 %s, nodes [a b]", ref, err, want.Size, want.SHA256)
	}
	if _, _, ok, _ := s.get("read inline", s.key("inputs", "call_big")); ok {
		t.Error("held inputs are also in etcd's inputs/ key")
	}
}

// A write waiting for its payloads to be held on nodes holds back the later
// writes of its call, not other calls' writes: they commit first, and the
// call's own writes commit in the order queued once its payloads are held.
func TestHoldingAPayloadDelaysOnlyItsOwnCall(t *testing.T) {
	m := startMember(t, t.TempDir())
	p := newFakePayloads()
	release := make(chan struct{})
	p.block["call_slow"] = release
	s := openStore(t, m, Options{Payloads: p})
	defer s.Close()

	order := make(chan string, 3)
	done := func(what string) func(error) {
		return func(err error) {
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
			order <- what
		}
	}
	slow := store.Call{ID: "call_slow", State: store.CallQueued, Inputs: jsonOf(InlineLimit+1, "i")}
	s.SaveCallAsync(slow, done("slow queued"))
	slow.State, slow.Inputs = store.CallRunning, nil
	s.SaveCallAsync(slow, done("slow running"))
	s.SaveCallAsync(store.Call{ID: "call_fast", State: store.CallQueued}, done("fast queued"))

	if got := <-order; got != "fast queued" {
		t.Fatalf("first commit: %s, want the other call's write", got)
	}
	close(release)
	for _, want := range []string{"slow queued", "slow running"} {
		if got := <-order; got != want {
			t.Errorf("next commit: %s, want %s", got, want)
		}
	}
	if c, err := s.GetCallResult("call_slow"); err != nil || c.State != store.CallRunning {
		t.Errorf("call_slow = %s, %v; want its last write, running", c.State, err)
	}
}

// A write whose payloads cannot be held fails and leaves nothing in etcd.
func TestFailedHoldFailsTheWrite(t *testing.T) {
	m := startMember(t, t.TempDir())
	p := newFakePayloads()
	p.putErr = errors.New("no other node answered")
	s := openStore(t, m, Options{Payloads: p})
	defer s.Close()
	err := s.SaveCall(context.Background(), store.Call{ID: "call_1", State: store.CallQueued, Inputs: jsonOf(InlineLimit+1, "i")})
	if err == nil || !strings.Contains(err.Error(), "no other node answered") {
		t.Errorf("SaveCall = %v, want the holding error", err)
	}
	if _, err := s.GetCallResult("call_1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetCallResult of the failed write = %v, want ErrNotFound", err)
	}
}

// A payload no holder gives (all gone, or a copy that is not the one etcd
// names) fails the read with an error naming the holders, within the
// payload timeout, never with other bytes.
func TestUnreachablePayloadNamesItsNodes(t *testing.T) {
	m := startMember(t, t.TempDir())
	p := newFakePayloads()
	s := openStore(t, m, Options{Payloads: p})
	defer s.Close()
	out := jsonOf(InlineLimit+1, "o")
	if err := s.SaveCall(context.Background(), store.Call{ID: "call_1", State: store.CallSucceeded, Outputs: out}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		fail, corrupt bool
	}{{"holders gone", true, false}, {"wrong bytes", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			p.mu.Lock()
			p.fail, p.corrupt = tc.fail, tc.corrupt
			p.mu.Unlock()
			_, err := s.GetCallResult("call_1")
			var ue *store.PayloadUnreachableError
			if !errors.As(err, &ue) {
				t.Fatalf("GetCallResult = %v, want a PayloadUnreachableError", err)
			}
			if want := "the call's outputs are on node(s) a, b, which cannot be reached"; ue.Error() != want {
				t.Errorf("error text %q, want %q", ue.Error(), want)
			}
		})
	}
}

// Expiry removes a call's refs and has Payloads delete its copies from the
// nodes that hold them; a call with inline payloads only costs no Delete.
func TestExpiryDeletesHeldPayloads(t *testing.T) {
	m := startMember(t, t.TempDir())
	p := newFakePayloads()
	now := time.Now()
	s := openStore(t, m, Options{Payloads: p, Now: func() time.Time { return now }})
	defer s.Close()
	ctx := context.Background()
	for _, c := range []store.Call{
		{ID: "call_held", State: store.CallSucceeded, Inputs: jsonOf(InlineLimit+1, "i"), Outputs: jsonOf(InlineLimit+1, "o"), Finished: now},
		{ID: "call_inline", State: store.CallSucceeded, Inputs: jsonOf(100, "i"), Finished: now},
	} {
		if err := s.SaveCall(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.ExpireCalls(now.Add(time.Second)); err != nil || n != 2 {
		t.Fatalf("ExpireCalls = %d, %v; want 2", n, err)
	}
	p.mu.Lock()
	deleted := p.deleted
	p.mu.Unlock()
	if len(deleted) != 1 || !slices.Equal(deleted["call_held"], []string{"a", "b"}) {
		t.Errorf("Payloads.Delete calls %v, want call_held from [a b] only", deleted)
	}
	resp, err := s.cli.Get(ctx, s.key("payloads")+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 0 {
		t.Errorf("payloads/ after expiry: %d keys, %v; want none", len(resp.Kvs), err)
	}
}
