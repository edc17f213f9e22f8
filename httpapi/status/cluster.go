package status

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/cluster"
	"inferd/httpapi/respond"
)

// ClusterView is what the status endpoints and the metrics show of a
// cluster (cluster mode, docs/cluster.md): *cluster.Node has it. Nil on a
// single box, which shows no cluster section and no node label.
type ClusterView interface {
	// Name is this node's name.
	Name() string
	// Nodes are the live nodes, sorted by name.
	Nodes() []cluster.NodeInfo
	// Leader is the leader's node name, "" while there is none.
	Leader() string
	// Placement is where the leader placed project's replicas.
	Placement(project string) (cluster.Placement, bool)
}

// Cluster is the cluster section of GET /v1/status: this node, the
// leader, every live node with its capacity and load, and where each
// visible project's replicas are placed. A team key sees only its own
// projects in the loads and placements.
type Cluster struct {
	Node      string      `json:"node"`   // the node that answered
	Leader    string      `json:"leader"` // "" while there is none
	Nodes     []Node      `json:"nodes"`
	Placement []Placement `json:"placement"` // visible projects, by id
}

type Node struct {
	Name      string    `json:"name"`
	Advertise string    `json:"advertise"`
	Leader    bool      `json:"leader"`
	Self      bool      `json:"self"`   // the node that answered
	Member    bool      `json:"member"` // runs an etcd member
	Started   time.Time `json:"started"`
	Updated   time.Time `json:"updated"` // when it last published its capacity
	GPUs      NodeGPUs  `json:"gpus"`
	CPUSlots  int       `json:"cpuSlots"`
	CPUUsed   int       `json:"cpuUsed"`
	// Projects is the node's load of each visible project it holds
	// replicas or calls of, by id.
	Projects []NodeProject `json:"projects"`
}

// NodeGPUs counts a node's GPUs: Free are healthy and held whole by no
// replica; the memory sums are over the healthy ones.
type NodeGPUs struct {
	Total          int   `json:"total"`
	Free           int   `json:"free"`
	MemoryTotalMiB int64 `json:"memoryTotalMiB"`
	MemoryFreeMiB  int64 `json:"memoryFreeMiB"`
}

type NodeProject struct {
	ID       string `json:"id"`
	Replicas int    `json:"replicas"` // booting or ready
	Ready    int    `json:"ready"`
	Busy     int    `json:"busy"`   // calls running
	Queued   int    `json:"queued"` // calls waiting
}

type Placement struct {
	Project string       `json:"project"`
	Nodes   []PlacedNode `json:"nodes"` // by node name; empty until the leader has placed it
	Updated *time.Time   `json:"updated"`
}

type PlacedNode struct {
	Node string `json:"node"`
	Min  int    `json:"min"`
	Max  int    `json:"max"`
}

// viewCluster renders the cluster section for what v may see, or nil on a
// single box.
func viewCluster(c ClusterView, v view) *Cluster {
	if c == nil {
		return nil
	}
	visible := make(map[string]bool, len(v.projects))
	for _, p := range v.projects {
		visible[p.ID] = true
	}
	self, leader := c.Name(), c.Leader()
	out := &Cluster{Node: self, Leader: leader, Nodes: []Node{}, Placement: []Placement{}}
	for _, n := range c.Nodes() {
		sn := Node{Name: n.Name, Advertise: n.Advertise, Leader: n.Name == leader, Self: n.Name == self,
			Member: n.Member, Started: n.Started, Updated: n.Updated,
			CPUSlots: n.Capacity.CPUSlots, CPUUsed: n.Capacity.CPUUsed, Projects: []NodeProject{}}
		for _, g := range n.Capacity.GPUs {
			sn.GPUs.Total++
			if !g.Healthy {
				continue
			}
			if !g.InUse {
				sn.GPUs.Free++
			}
			sn.GPUs.MemoryTotalMiB += g.TotalMiB
			sn.GPUs.MemoryFreeMiB += g.FreeMiB
		}
		for id, l := range n.Projects {
			if visible[id] {
				sn.Projects = append(sn.Projects, NodeProject{ID: id, Replicas: l.Replicas, Ready: l.Ready, Busy: l.Busy, Queued: l.Queued})
			}
		}
		slices.SortFunc(sn.Projects, func(a, b NodeProject) int { return strings.Compare(a.ID, b.ID) })
		out.Nodes = append(out.Nodes, sn)
	}
	for _, p := range v.projects { // sorted by id
		sp := Placement{Project: p.ID, Nodes: []PlacedNode{}}
		if pl, ok := c.Placement(p.ID); ok {
			for node, sh := range pl.Nodes {
				sp.Nodes = append(sp.Nodes, PlacedNode{Node: node, Min: sh.Min, Max: sh.Max})
			}
			slices.SortFunc(sp.Nodes, func(a, b PlacedNode) int { return strings.Compare(a.Node, b.Node) })
			if !pl.Updated.IsZero() {
				u := pl.Updated
				sp.Updated = &u
			}
		}
		out.Placement = append(out.Placement, sp)
	}
	return out
}

// cluster handles GET /v1/status/cluster (cluster mode only): the cluster
// section of /v1/status alone, without the recent calls' read.
func (s *api) cluster(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	v, err := s.read(r, false)
	if err != nil {
		respond.Error(w, r, s.log, err)
		return
	}
	respond.JSON(w, http.StatusOK, viewCluster(s.clusterView, v))
}
