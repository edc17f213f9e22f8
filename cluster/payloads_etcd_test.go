package cluster

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"inferd/store"
	"inferd/store/etcd"
)

// Three nodes on one etcd, each store holding its large payloads through
// its PayloadStore: a call's inputs and outputs written through one node
// are read through the others, still after that node dies; with both
// holders of its outputs gone the read names them. Expiry through any node
// deletes the files of every holder.
func TestCallPayloadsSurviveOneNodesDeath(t *testing.T) {
	m := startMember(t)
	members, nodes := payloadCluster(t, "a", "b", "c")
	stores := map[string]*etcd.Store{}
	for name, n := range nodes {
		s, err := etcd.Open(etcd.Options{Endpoints: m.ClientURLs(), Node: name, Payloads: n.p, PayloadTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores[name] = s
	}
	ctx := context.Background()
	in := []byte(`"` + string(bytes.Repeat([]byte("i"), 100<<10)) + `"`)
	out := []byte(`"` + string(bytes.Repeat([]byte("o"), 200<<10)) + `"`)
	c := store.Call{ID: "call_big", State: store.CallQueued, Inputs: in, Created: time.Now()}
	if err := stores["a"].SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	c.State, c.Inputs, c.Outputs, c.Finished = store.CallSucceeded, nil, out, time.Now()
	if err := stores["a"].SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	expiring := store.Call{ID: "call_old", State: store.CallSucceeded, Inputs: in, Outputs: out, Finished: time.Now().Add(-time.Hour)}
	if err := stores["b"].SaveCall(ctx, expiring); err != nil {
		t.Fatal(err)
	}
	holders := func(id, kind string) []string {
		var hs []string
		for _, name := range []string{"a", "b", "c"} {
			if _, ok := nodes[name].holds(id, kind); ok {
				hs = append(hs, name)
			}
		}
		return hs
	}
	if hs := holders("call_old", etcd.KindOutputs); len(hs) != 2 {
		t.Fatalf("call_old's outputs are on %v, want two nodes", hs)
	}
	if n, err := stores["c"].ExpireCalls(time.Now().Add(-time.Minute)); err != nil || n != 1 {
		t.Fatalf("ExpireCalls through c = %d, %v; want call_old", n, err)
	}
	for _, kind := range []string{etcd.KindInputs, etcd.KindOutputs} {
		if hs := holders("call_old", kind); len(hs) != 0 {
			t.Errorf("after expiry call_old's %s are still on %v", kind, hs)
		}
	}

	// A file left by a write that never committed goes at a sweep; the
	// files etcd names stay.
	orphan := filepath.Join(nodes["b"].dir, "call_orphan.outputs")
	if err := os.WriteFile(orphan, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	kept := len(holdersOn(nodes["b"]))
	if n, err := nodes["b"].p.Sweep(stores["b"], time.Now().Add(time.Minute)); err != nil || n != 1 {
		t.Errorf("Sweep on b = %d, %v; want the orphan removed", n, err)
	}
	if got := len(holdersOn(nodes["b"])); got != kept-1 {
		t.Errorf("b holds %d files after the sweep, want %d", got, kept-1)
	}

	outHolders := holders("call_big", etcd.KindOutputs)
	if len(outHolders) != 2 || outHolders[0] != "a" || len(holders("call_big", etcd.KindInputs)) != 2 {
		t.Fatalf("call_big's outputs on %v, inputs on %v; want each on a and one other", outHolders, holders("call_big", etcd.KindInputs))
	}
	nodes["a"].srv.Close() // a dies
	members.drop("a")
	for _, name := range []string{"b", "c"} {
		got, err := stores[name].GetCall("call_big")
		if err != nil || !bytes.Equal(got.Inputs, in) || !bytes.Equal(got.Outputs, out) {
			t.Errorf("GetCall through %s with a dead = %d, %d bytes, %v; want both payloads", name, len(got.Inputs), len(got.Outputs), err)
		}
	}

	second := outHolders[1]
	reader := "b"
	if second == "b" {
		reader = "c"
	}
	nodes[second].srv.Close() // the other holder of the outputs dies too
	members.drop(second)
	if err := os.RemoveAll(filepath.Join(nodes[second].dir)); err != nil {
		t.Fatal(err)
	}
	_, err := stores[reader].GetCallResult("call_big")
	var ue *store.PayloadUnreachableError
	if !errors.As(err, &ue) || ue.Error() != "the call's outputs are on node(s) a, "+second+", which cannot be reached" {
		t.Errorf("GetCallResult through %s with both holders dead = %v; want the outputs' nodes named", reader, err)
	}
}

// holdersOn lists the payload files of a node.
func holdersOn(n *payloadNode) []string {
	entries, _ := os.ReadDir(n.dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
