package cluster

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// fakeView is a cluster view the test edits; set calls the Router's
// PlacementChanged as the Node's watch would.
type fakeView struct {
	name       string
	members    // the live nodes (payloads_test.go); its mu also guards placements
	placements map[string]Placement
}

func newFakeView(name string, nodes ...NodeInfo) *fakeView {
	v := &fakeView{name: name, members: members{nodes: map[string]NodeInfo{}}, placements: map[string]Placement{}}
	for _, n := range nodes {
		v.nodes[n.Name] = n
	}
	return v
}

func (v *fakeView) Name() string { return v.name }

func (v *fakeView) Placement(project string) (Placement, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	p, ok := v.placements[project]
	return p, ok
}

func (v *fakeView) place(project string, nodes ...string) {
	p := Placement{Project: project, Nodes: map[string]Share{}}
	for _, n := range nodes {
		p.Nodes[n] = Share{Min: 0, Max: 2}
	}
	v.mu.Lock()
	v.placements[project] = p
	v.mu.Unlock()
}

// loadedNode is a live node with a load of project p.
func loadedNode(name string, p string, replicas, busy, queued int) NodeInfo {
	return NodeInfo{Name: name, Advertise: "http://" + name,
		Projects: map[string]ProjectLoad{p: {Replicas: replicas, Busy: busy, Queued: queued}}}
}

func names(nodes []NodeInfo) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	return out
}

func TestRouteFollowsPlacement(t *testing.T) {
	never := func() bool { t.Error("fitsHere asked with a placement"); return true }
	for _, tc := range []struct {
		name   string
		nodes  []NodeInfo
		placed []string
		local  bool
		want   []string
	}{
		{name: "placed here runs here", placed: []string{"a", "b"}, local: true,
			nodes: []NodeInfo{loadedNode("a", "p", 1, 5, 5), loadedNode("b", "p", 1, 0, 0)}},
		{name: "elsewhere goes to the least loaded per replica", placed: []string{"b", "c", "d"},
			nodes: []NodeInfo{loadedNode("a", "p", 0, 0, 0), loadedNode("b", "p", 1, 1, 2), loadedNode("c", "p", 4, 4, 4), loadedNode("d", "p", 2, 2, 3)},
			want:  []string{"c", "d", "b"}}, // c: 8/4 = 2, d: 5/2 = 2.5, b: 3/1 = 3
		{name: "equal loads by name", placed: []string{"d", "c", "b"},
			nodes: []NodeInfo{loadedNode("a", "p", 0, 0, 0), loadedNode("b", "p", 2, 1, 1), loadedNode("c", "p", 1, 1, 0), loadedNode("d", "p", 0, 0, 0)},
			want:  []string{"d", "b", "c"}}, // d: 0, b: 1, c: 1
		{name: "a node with no replica counts its queue", placed: []string{"b", "c"},
			nodes: []NodeInfo{loadedNode("a", "p", 0, 0, 0), loadedNode("b", "p", 0, 0, 3), loadedNode("c", "p", 1, 1, 1)},
			want:  []string{"c", "b"}},
		{name: "a placed node that is not live is left out", placed: []string{"b", "gone"},
			nodes: []NodeInfo{loadedNode("a", "p", 0, 0, 0), loadedNode("b", "p", 1, 9, 9)},
			want:  []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newFakeView("a", tc.nodes...)
			v.place("p", tc.placed...)
			rt, err := NewRouter(v).Route(context.Background(), "p", never)
			if err != nil {
				t.Fatal(err)
			}
			if rt.Local != tc.local || !slices.Equal(names(rt.Nodes), tc.want) {
				t.Errorf("Route = local %v, nodes %v; want local %v, nodes %v", rt.Local, names(rt.Nodes), tc.local, tc.want)
			}
		})
	}
}

func TestRouteWithoutPlacementRunsHereWhenItFits(t *testing.T) {
	v := newFakeView("a", loadedNode("a", "p", 0, 0, 0), loadedNode("b", "p", 0, 0, 0))
	rt, err := NewRouter(v).Route(context.Background(), "p", func() bool { return true })
	if err != nil || !rt.Local {
		t.Errorf("Route = %+v, %v; want local", rt, err)
	}
}

func TestRouteWaitsForThePlacementOfANewProject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newFakeView("a", loadedNode("a", "p", 0, 0, 0), loadedNode("b", "p", 0, 0, 0))
		r := NewRouter(v)
		start := time.Now()
		type result struct {
			rt  Route
			err error
		}
		got := make(chan result, 1)
		go func() {
			rt, err := r.Route(context.Background(), "p", func() bool { return false })
			got <- result{rt, err}
		}()
		synctest.Wait() // the start waits
		time.Sleep(time.Second)
		v.place("other", "b")
		r.PlacementChanged("other") // another project's placement: waits on
		synctest.Wait()
		select {
		case res := <-got:
			t.Fatalf("Route answered %+v, %v before its project was placed", res.rt, res.err)
		default:
		}
		v.place("p", "b")
		r.PlacementChanged("p")
		res := <-got
		if res.err != nil || res.rt.Local || !slices.Equal(names(res.rt.Nodes), []string{"b"}) {
			t.Errorf("Route = %+v, %v; want node b", res.rt, res.err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("answered after %s, want at the placement (1s)", waited)
		}
	})
}

func TestRouteWithoutPlacementGivesUpAfterPlacementWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newFakeView("a", loadedNode("a", "p", 0, 0, 0))
		v.place("p", "gone") // placed on a node whose lease ended: as none
		start := time.Now()
		_, err := NewRouter(v).Route(context.Background(), "p", nil)
		if !errors.Is(err, ErrNoNode) {
			t.Fatalf("err %v, want ErrNoNode", err)
		}
		if waited := time.Since(start); waited != PlacementWait {
			t.Errorf("gave up after %s, want %s", waited, PlacementWait)
		}
	})
}

func TestRouteWaitEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newFakeView("a")
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := NewRouter(v).Route(ctx, "p", nil)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err %v, want the context's", err)
		}
	})
}
