package cluster

import "time"

// LeaseTTL is the lease a node holds its nodes/<name> key (and its
// election candidacy) under. The prototype measured that a TTL at etcd's
// minimum (2 s with a 1 s election timeout) let survivors' sessions expire
// during an etcd leader change; 5 s did not (research/scaleout.md).
const LeaseTTL = 5 * time.Second

// Key names under the store's prefix (see the package documentation).
const (
	NodesPrefix     = "nodes/"
	ElectionPrefix  = "election/"
	PlacementPrefix = "placement/"
	AssignPrefix    = "assign/"
)

// NodeInfo is what a node publishes about itself at nodes/<name>.
type NodeInfo struct {
	Name string `json:"name"`
	// Advertise is the base URL the other nodes reach this node's API at.
	Advertise string    `json:"advertise"`
	Lease     int64     `json:"lease"` // the etcd lease the key is under
	Started   time.Time `json:"started"`
	Updated   time.Time `json:"updated"`
	Member    bool      `json:"member"` // runs an etcd member
	Capacity  Capacity  `json:"capacity"`
	// Projects is this node's load per project id: only projects with
	// replicas or calls here.
	Projects map[string]ProjectLoad `json:"projects,omitempty"`
	// Teams is the state of each team with a leased quota here: its share
	// in force, use and want (quota.go).
	Teams map[string]TeamLoad `json:"teams,omitempty"`
}

// Capacity is what a node can place replicas on.
type Capacity struct {
	GPUs     []GPUInfo `json:"gpus,omitempty"`
	CPUSlots int       `json:"cpuSlots"` // CPU replicas the node runs at most
	CPUUsed  int       `json:"cpuUsed"`  // CPU replicas running or booting
}

// GPUInfo is one placement unit (a whole GPU or a MIG device) of a node.
type GPUInfo struct {
	Index    int    `json:"index"`
	UUID     string `json:"uuid,omitempty"`
	Name     string `json:"name,omitempty"`
	TotalMiB int64  `json:"totalMiB"`
	FreeMiB  int64  `json:"freeMiB"` // what the node's scheduler could still place
	Healthy  bool   `json:"healthy"`
	InUse    bool   `json:"inUse"` // a replica holds it whole
}

// ProjectLoad is one project's state on one node.
type ProjectLoad struct {
	Replicas int `json:"replicas"` // booting or ready
	Ready    int `json:"ready"`
	Busy     int `json:"busy"`   // calls running
	Queued   int `json:"queued"` // calls waiting
	Max      int `json:"max"`    // the most replicas this node may run of it now
}

// Placement is where a project's replicas go, at placement/<project>,
// written by the leader. A node not named runs no replica of the project
// and forwards its starts to a node that is.
type Placement struct {
	Project string           `json:"project"`
	Nodes   map[string]Share `json:"nodes"`
	// Joined is when each node entered the placement (the scale-in grace,
	// cluster/placement.go); a node without one joined long ago.
	Joined  map[string]time.Time `json:"joined,omitempty"`
	Leader  string               `json:"leader"` // the node that wrote it
	Updated time.Time            `json:"updated"`
}

// Share is one node's part of a project's replicas: its local minimum and
// maximum (the project's own bounds are for the whole cluster).
type Share struct {
	Min int `json:"min"`
	Max int `json:"max"`
}
