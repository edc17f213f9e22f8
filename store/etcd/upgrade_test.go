package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// putLayout2 writes, with a plain client, the keys a layout 2 node wrote
// for a sync start that finished at t (its one final write: the record
// without payloads, inputs/, inputsize/, outputs/, finished/ and its usage
// entry) and for a call queued on node "old-1" (record, inputs/,
// inputsize/, pending/), under prefix, with the version "2".
func putLayout2(t *testing.T, cli *clientv3.Client, prefix string, final, queued store.Call) {
	t.Helper()
	rec := func(c store.Call) string {
		b, err := store.AppendRecord(nil, c)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	row, ok := store.CallUsageRow(final)
	if !ok {
		t.Fatal("the final call adds no usage")
	}
	usage, err := json.Marshal(row)
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string]string{
		"schema":             "2",
		"calls/" + final.ID:  rec(final),
		"inputs/" + final.ID: string(final.Inputs), "inputsize/" + final.ID: fmt.Sprint(len(final.Inputs)),
		"outputs/" + final.ID: string(final.Outputs),
		fmt.Sprintf("finished/%020d/%s", final.Finished.UnixNano(), final.ID):             "",
		fmt.Sprintf("usage/c/%020d/%s", store.UsageHour(final.Finished).Unix(), final.ID): string(usage),
		"calls/" + queued.ID:  rec(queued),
		"inputs/" + queued.ID: string(queued.Inputs), "inputsize/" + queued.ID: fmt.Sprint(len(queued.Inputs)),
		"pending/" + queued.ID: "old-1",
	}
	for k, v := range kv {
		if _, err := cli.Put(context.Background(), prefix+k, v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOpenUpgradesLayout2AndReadsItsCalls: a prefix that layout 2 nodes
// wrote (a cluster before this release, or a backup of one restored) is
// upgraded by the first node of this release that opens it with no other
// node live, and every read finds the calls layout 2 wrote: payloads and
// sizes in their own keys, the usage entry, the pending call to recover.
// The calls written since keep their small payloads in the record and put
// no inputs/, inputsize/ or outputs/ key; expiry leaves no key of either.
func TestOpenUpgradesLayout2AndReadsItsCalls(t *testing.T) {
	m := startMember(t, t.TempDir())
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.ClientURLs()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const prefix = "/old/"
	hour := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	cpu := 0.5
	final := store.Call{ID: "call_old_sync", ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Attempt: 1,
		Created: hour.Add(time.Minute), Dispatched: hour.Add(time.Minute), Finished: hour.Add(2 * time.Minute),
		Inputs: json.RawMessage(`{"prompt": "old"}`), Outputs: json.RawMessage(`{"text": "old reply"}`), Message: "success",
		Usage: &store.CallUsage{ReplicaSeconds: 1, CPUSeconds: &cpu, BytesIn: 17, BytesOut: 23}}
	queued := store.Call{ID: "call_old_queued", ProjectID: "p", TeamID: "t", State: store.CallQueued,
		Created: hour.Add(3 * time.Minute), Inputs: json.RawMessage(`{"prompt": "waiting"}`)}
	putLayout2(t, cli, prefix, final, queued)

	s := openStore(t, m, Options{Prefix: prefix, Node: "old-1", Now: func() time.Time { return hour.Add(5 * time.Minute) }})
	defer s.Close()
	if v, err := cli.Get(context.Background(), prefix+"schema"); err != nil || string(v.Kvs[0].Value) != schemaVersion {
		t.Fatalf("schema after Open = %v, %v; want %s", v.Kvs, err, schemaVersion)
	}

	got, err := s.GetCall(final.ID)
	if err != nil || !bytes.Equal(got.Inputs, final.Inputs) || !bytes.Equal(got.Outputs, final.Outputs) || got.State != store.CallSucceeded {
		t.Errorf("GetCall(layout 2 call) = %s, inputs %s, outputs %s, %v; want succeeded with both as written", got.State, got.Inputs, got.Outputs, err)
	}
	if r, err := s.GetCallResult(final.ID); err != nil || r.Inputs != nil || r.InputBytes != int64(len(final.Inputs)) || !bytes.Equal(r.Outputs, final.Outputs) {
		t.Errorf("GetCallResult(layout 2 call) = inputs %s, InputBytes %d, outputs %s, %v; want no inputs, InputBytes %d, the outputs", r.Inputs, r.InputBytes, r.Outputs, err, len(final.Inputs))
	}
	pending, err := s.PendingCalls()
	if err != nil || len(pending) != 1 || pending[0].ID != queued.ID || pending[0].Inputs != nil || pending[0].InputBytes != int64(len(queued.Inputs)) {
		t.Fatalf("PendingCalls = %+v, %v; want the layout 2 queued call, without inputs, InputBytes %d", pending, err, len(queued.Inputs))
	}
	if in, err := s.CallInputs(queued.ID); err != nil || !bytes.Equal(in, queued.Inputs) {
		t.Errorf("CallInputs(layout 2 queued call) = %s, %v; want %s", in, err, queued.Inputs)
	}

	// The queued call finishes under layout 3, its write carrying its
	// small inputs (the scheduler keeps them): the record holds them now,
	// the reads take them from there.
	done := queued
	done.State, done.Attempt, done.Dispatched, done.Finished = store.CallSucceeded, 1, hour.Add(4*time.Minute), hour.Add(4*time.Minute)
	done.Outputs, done.Message, done.Usage = json.RawMessage(`{"text": "new reply"}`), "success", final.Usage
	if err := s.SaveCall(context.Background(), done); err != nil {
		t.Fatal(err)
	}
	if r, err := s.GetCallResult(done.ID); err != nil || r.InputBytes != int64(len(done.Inputs)) || !bytes.Equal(r.Outputs, done.Outputs) {
		t.Errorf("GetCallResult(finished under layout 3) = InputBytes %d, outputs %s, %v; want %d, %s", r.InputBytes, r.Outputs, err, len(done.Inputs), done.Outputs)
	}
	if in, err := s.CallInputs(done.ID); err != nil || !bytes.Equal(in, done.Inputs) {
		t.Errorf("CallInputs(finished under layout 3) = %s, %v; want %s", in, err, done.Inputs)
	}

	// A sync start under layout 3: only the record and the indexes.
	sync := final
	sync.ID, sync.Finished = "call_new_sync", hour.Add(4*time.Minute)
	if err := s.SaveCall(context.Background(), sync); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"inputs", "inputsize", "outputs"} {
		if r, err := cli.Get(context.Background(), prefix+dir+"/"+sync.ID); err != nil || len(r.Kvs) != 0 {
			t.Errorf("%s/%s = %v, %v; want no key: a final write keeps small payloads in the record", dir, sync.ID, r.Kvs, err)
		}
	}
	if got, err := s.GetCall(sync.ID); err != nil || !bytes.Equal(got.Inputs, sync.Inputs) || !bytes.Equal(got.Outputs, sync.Outputs) {
		t.Errorf("GetCall(layout 3 sync start) = inputs %s, outputs %s, %v; want both as written", got.Inputs, got.Outputs, err)
	}

	// The usage of all three: layout 2's entry, and two written since.
	rows, err := s.UsageRows("t", hour, hour.Add(time.Hour))
	if err != nil || len(rows) != 1 || rows[0].Calls != 3 || rows[0].BytesIn != 3*17 {
		t.Errorf("UsageRows = %+v, %v; want one row of 3 calls, %d bytes in", rows, err, 3*17)
	}

	// Expiry removes every key of the calls of either layout.
	if n, err := s.ExpireCalls(hour.Add(time.Hour)); err != nil || n != 3 {
		t.Fatalf("ExpireCalls = %d, %v; want 3", n, err)
	}
	for _, dir := range []string{"calls", "inputs", "inputsize", "outputs", "pending", "finished"} {
		if r, err := cli.Get(context.Background(), prefix+dir+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
			t.Errorf("%s/ after expiry: %d keys, %v; want none", dir, r.Count, err)
		}
	}
}

// TestOpenUpgradesLayout2OnlyOnceNoEarlierNodeRuns: while a node of an
// earlier release is live (its nodes/ key under its lease), a node of this
// release refuses to upgrade the layout, naming it, and the version stays
// 2 for the nodes that run; its own key from an earlier run does not stop
// it. Once the last other key goes (that node stopped, or a restored
// snapshot's lease lapsed) a waiting Open upgrades and opens.
func TestOpenUpgradesLayout2OnlyOnceNoEarlierNodeRuns(t *testing.T) {
	m := startMember(t, t.TempDir())
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.ClientURLs()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	const prefix = "/rolling/"
	live := func(name string) clientv3.LeaseID {
		t.Helper()
		l, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, prefix+NodesDir+"/"+name, "{}", clientv3.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	if _, err := cli.Put(ctx, prefix+"schema", upgradableFrom); err != nil {
		t.Fatal(err)
	}
	old := live("old-2")
	live("new-1") // this node's own key, left by its last run

	_, err = Open(Options{Endpoints: m.ClientURLs(), Prefix: prefix, Node: "new-1", UpgradeWait: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "old-2") || strings.Contains(err.Error(), "new-1") {
		t.Fatalf("Open with node old-2 live = %v; want a refusal naming old-2 (not this node)", err)
	}
	if v, err := cli.Get(ctx, prefix+"schema"); err != nil || string(v.Kvs[0].Value) != upgradableFrom {
		t.Fatalf("schema after the refusal = %v, %v; want %s kept", v.Kvs, err, upgradableFrom)
	}

	opened := make(chan error, 1)
	go func() {
		s, err := Open(Options{Endpoints: m.ClientURLs(), Prefix: prefix, Node: "new-1", UpgradeWait: time.Minute})
		if err == nil {
			s.Close()
		}
		opened <- err
	}()
	// The Open cannot upgrade while old-2 is live: it succeeds only after
	// this revoke, whenever it began.
	if _, err := cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("Open once old-2 went = %v", err)
	}
	if v, err := cli.Get(ctx, prefix+"schema"); err != nil || string(v.Kvs[0].Value) != schemaVersion {
		t.Fatalf("schema after the upgrade = %v, %v; want %s", v.Kvs, err, schemaVersion)
	}
}
