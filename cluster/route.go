package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Starts follow placement: a start of project P runs on the node that
// received it when that node is in P's placement; otherwise that node
// forwards the request to a placed node (httpapi does the forwarding, this
// file only chooses). Reading the placement from the view's watch cache
// keeps the hot path free of etcd round trips.

// PlacementWait is how long a start of a project with no placement yet (a
// project just created), which this node cannot run itself, waits for the
// leader to place it.
const PlacementWait = 2 * time.Second

// ForwardedHeader marks a request that a node forwarded to another; its
// value is the sending node's name. It counts only on a request whose
// AuthHeader signature verifies, and such a request is never forwarded
// again: a placement that changed in between cannot bounce it around.
const ForwardedHeader = "X-Inferd-Forwarded-By"

// ErrNoNode is Route's error when no node can take a start now: the
// project has no live placed node and this node cannot run it.
var ErrNoNode = errors.New("no node can run the project now")

// View is what a Router reads of the cluster; *Node has it. Nodes,
// NodeInfo and Placement answer from the node's watch cache.
type View interface {
	Name() string
	Nodes() []NodeInfo
	NodeInfo(name string) (NodeInfo, bool)
	Placement(project string) (Placement, bool)
}

// Router chooses the node a start runs on. Whoever owns the view's
// placement cache calls PlacementChanged on every change, which wakes the
// starts waiting for a new project's placement.
type Router struct {
	view View
	wait time.Duration

	mu      sync.Mutex
	changed chan struct{} // closed and replaced by PlacementChanged
}

// NewRouter returns the Router of the node whose cluster view is view.
func NewRouter(view View) *Router {
	return &Router{view: view, wait: PlacementWait, changed: make(chan struct{})}
}

// Route is where a start goes: this node (Local), or one of Nodes, best
// first; the caller tries the next when one cannot be reached.
type Route struct {
	Local bool
	Nodes []NodeInfo
}

// PlacementChanged tells the router that project's placement changed (it
// fits Options.OnPlacement). It wakes every waiting start, which reads its
// own project's placement again: waits are rare and short, so one signal
// for all is simpler than one per project. It never blocks.
func (r *Router) PlacementChanged(project string) {
	r.mu.Lock()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// Node returns a live node's record, as the view has it.
func (r *Router) Node(name string) (NodeInfo, bool) { return r.view.NodeInfo(name) }

// Route says where a start of project runs:
//   - here, when this node is in the project's placement;
//   - else the live placed nodes, the least loaded first (calls queued and
//     running per replica, from their NodeInfo; ties by name);
//   - with no live placed node: here when fitsHere says this node could run
//     it (fitsHere is asked only then, and may be nil: it cannot), else
//     whatever the placement says once the leader writes one, waiting up to
//     PlacementWait for it; then ErrNoNode. A ctx that ends first ends the
//     wait with its error.
func (r *Router) Route(ctx context.Context, project string, fitsHere func() bool) (Route, error) {
	if rt, ok := r.placed(project); ok {
		return rt, nil
	}
	if fitsHere != nil && fitsHere() {
		return Route{Local: true}, nil
	}
	timer := time.NewTimer(r.wait)
	defer timer.Stop()
	for {
		// Take the change signal before reading the placement, so that a
		// change between the read and the wait still wakes it.
		r.mu.Lock()
		changed := r.changed
		r.mu.Unlock()
		if rt, ok := r.placed(project); ok {
			return rt, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return Route{}, fmt.Errorf("route a start of project %s: %w (no placement after %s)", project, ErrNoNode, r.wait)
		case <-ctx.Done():
			return Route{}, fmt.Errorf("route a start of project %s: %w", project, ctx.Err())
		}
	}
}

// placed is the route the project's placement gives, if it names this node
// or a live node.
func (r *Router) placed(project string) (Route, bool) {
	p, ok := r.view.Placement(project)
	if !ok {
		return Route{}, false
	}
	if _, ok := p.Nodes[r.view.Name()]; ok {
		return Route{Local: true}, true
	}
	var nodes []NodeInfo
	for name := range p.Nodes {
		if info, ok := r.view.NodeInfo(name); ok { // absent: its lease ended
			nodes = append(nodes, info)
		}
	}
	if len(nodes) == 0 {
		return Route{}, false
	}
	slices.SortFunc(nodes, func(a, b NodeInfo) int {
		// a's load below b's: (qa+ba)/ra < (qb+bb)/rb, compared without
		// division.
		la, ra := loadOf(a, project)
		lb, rb := loadOf(b, project)
		if c := cmp.Compare(la*rb, lb*ra); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return Route{Nodes: nodes}, true
}

// loadOf is a node's load of project as calls (queued and running) and
// replicas; a node with no replica yet counts as one, so that its queue
// still counts against it.
func loadOf(n NodeInfo, project string) (calls, replicas int) {
	l := n.Projects[project]
	return l.Queued + l.Busy, max(l.Replicas, 1)
}
