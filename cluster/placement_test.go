package cluster

import (
	"maps"
	"testing"
	"time"

	"inferd/store"
)

func gpu(i int, total, free int64, inUse bool) GPUInfo {
	return GPUInfo{Index: i, TotalMiB: total, FreeMiB: free, Healthy: true, InUse: inUse}
}

func node(name string, cpuSlots int, gpus ...GPUInfo) NodeInfo {
	return NodeInfo{Name: name, Capacity: Capacity{CPUSlots: cpuSlots, GPUs: gpus}}
}

func withLoad(n NodeInfo, project string, l ProjectLoad) NodeInfo {
	n.Projects = map[string]ProjectLoad{project: l}
	return n
}

func project(id string, minR, maxR, gpus, gpuMiB int) store.Project {
	p := store.NewProject(id, "acme")
	p.MinReplicas, p.MaxReplicas = minR, maxR
	p.Model.GPUs, p.Model.GPUMemoryMiB = gpus, gpuMiB
	p.Model.Command = []string{"/usr/bin/model"}
	p.Model.KeyHash = store.HashModelKey("key-" + id)
	return p
}

// placedAt is the time of the placement passes of the tests.
var placedAt = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func TestPlacement(t *testing.T) {
	type shares = map[string]Share
	cases := []struct {
		name     string
		projects []store.Project
		nodes    []NodeInfo
		current  map[string]Placement
		want     map[string]shares
	}{
		{
			name:     "a GPU project goes only to the node with a free GPU",
			projects: []store.Project{project("gpu", 1, 2, 1, 0)},
			nodes: []NodeInfo{node("a", 4), node("b", 4, gpu(0, 24000, 0, true)),
				node("c", 4, gpu(0, 24000, 24000, false))},
			want: map[string]shares{"gpu": {"c": {1, 2}}},
		},
		{
			name:     "a whole GPU counts as free with what the driver keeps back, not when shared",
			projects: []store.Project{project("gpu", 1, 1, 1, 0)},
			nodes: []NodeInfo{node("a", 0, gpu(0, 24000, 12000, false)),
				node("b", 0, gpu(0, 24000, 23500, false))},
			want: map[string]shares{"gpu": {"b": {1, 1}}},
		},
		{
			name:     "gpuMemoryMiB needs that much free on one GPU",
			projects: []store.Project{project("gpu", 1, 1, 1, 8000)},
			nodes:    []NodeInfo{node("a", 0, gpu(0, 24000, 4000, false)), node("b", 0, gpu(0, 24000, 9000, false))},
			want:     map[string]shares{"gpu": {"b": {1, 1}}},
		},
		{
			name:     "gpuMemoryMiB alone is a share of one GPU: never a node without one",
			projects: []store.Project{project("share", 1, 1, 0, 8000)},
			nodes:    []NodeInfo{node("a", 8), node("b", 0, gpu(0, 24000, 16000, false))},
			want:     map[string]shares{"share": {"b": {1, 1}}},
		},
		{
			name:     "an unhealthy GPU fits nothing",
			projects: []store.Project{project("gpu", 1, 1, 1, 0)},
			nodes:    []NodeInfo{node("a", 0, GPUInfo{TotalMiB: 24000, FreeMiB: 24000})},
			want:     map[string]shares{},
		},
		{
			name:     "two GPU projects do not share the one free GPU",
			projects: []store.Project{project("p1", 1, 1, 1, 0), project("p2", 1, 1, 1, 0)},
			nodes:    []NodeInfo{node("a", 0, gpu(0, 24000, 24000, false)), node("b", 0, gpu(0, 24000, 24000, false))},
			want:     map[string]shares{"p1": {"a": {1, 1}}, "p2": {"b": {1, 1}}},
		},
		{
			name:     "with every GPU held the project and its minimum go where they could fit once GPUs are free",
			projects: []store.Project{project("gpu", 1, 1, 2, 0)},
			nodes: []NodeInfo{node("a", 4, gpu(0, 24000, 0, true)),
				node("b", 4, gpu(0, 24000, 0, true), gpu(1, 24000, 0, true))},
			want: map[string]shares{"gpu": {"b": {1, 1}}},
		},
		{
			name:     "a CPU project needs a free CPU slot",
			projects: []store.Project{project("cpu", 1, 1, 0, 0)},
			nodes:    []NodeInfo{{Name: "a", Capacity: Capacity{CPUSlots: 2, CPUUsed: 2}}, node("b", 1)},
			want:     map[string]shares{"cpu": {"b": {1, 1}}},
		},
		{
			name:     "the minimum spreads over the nodes with room, the rest to the one with the most",
			projects: []store.Project{project("cpu", 3, 4, 0, 0)},
			nodes:    []NodeInfo{node("a", 1), node("b", 4), {Name: "c", Capacity: Capacity{CPUSlots: 1, CPUUsed: 1}}},
			want:     map[string]shares{"cpu": {"a": {1, 2}, "b": {2, 2}}},
		},
		{
			name:     "the minimum past all room goes to the placed nodes all the same",
			projects: []store.Project{project("cpu", 3, 3, 0, 0)},
			nodes:    []NodeInfo{node("a", 1), node("b", 1), {Name: "c", Capacity: Capacity{CPUSlots: 1, CPUUsed: 1}}},
			want:     map[string]shares{"cpu": {"a": {2, 2}, "b": {1, 1}}},
		},
		{
			name:     "min 0 still places the project on one node",
			projects: []store.Project{project("cpu", 0, 3, 0, 0)},
			nodes:    []NodeInfo{node("a", 1), node("b", 2)},
			want:     map[string]shares{"cpu": {"b": {0, 3}}},
		},
		{
			name:     "sticky: a placed node keeps the project though another has more room",
			projects: []store.Project{project("cpu", 0, 2, 0, 0)},
			nodes:    []NodeInfo{node("a", 1), node("b", 8)},
			current:  map[string]Placement{"cpu": {Nodes: shares{"a": {0, 2}}}},
			want:     map[string]shares{"cpu": {"a": {0, 2}}},
		},
		{
			name:     "a dead node's minimum is placed on the others",
			projects: []store.Project{project("cpu", 2, 2, 0, 0)},
			nodes:    []NodeInfo{withLoad(node("b", 4), "cpu", ProjectLoad{Replicas: 1, Ready: 1}), node("c", 4)},
			current:  map[string]Placement{"cpu": {Nodes: shares{"a": {1, 1}, "b": {1, 1}}}},
			want:     map[string]shares{"cpu": {"b": {1, 1}, "c": {1, 1}}},
		},
		{
			name:     "after a burst on one node the minimum spreads over every node with room",
			projects: []store.Project{project("cpu", 3, 6, 0, 0)},
			nodes: []NodeInfo{withLoad(node("a", 8), "cpu", ProjectLoad{Replicas: 4, Ready: 4, Busy: 4, Max: 6}),
				node("b", 8), node("c", 8)},
			current: map[string]Placement{"cpu": {Nodes: shares{"a": {3, 6}}}},
			want:    map[string]shares{"cpu": {"a": {1, 4}, "b": {1, 1}, "c": {1, 1}}},
		},
		{
			name:     "the minimum spreads over the nodes, then doubles up",
			projects: []store.Project{project("cpu", 4, 4, 0, 0)},
			nodes:    []NodeInfo{node("a", 8), node("b", 8), node("c", 8)},
			want:     map[string]shares{"cpu": {"a": {2, 2}, "b": {1, 1}, "c": {1, 1}}},
		},
		{
			name:     "a node that comes back gets its share of the minimum again",
			projects: []store.Project{project("cpu", 3, 3, 0, 0)},
			nodes: []NodeInfo{withLoad(node("a", 8), "cpu", ProjectLoad{Replicas: 2, Ready: 2}),
				withLoad(node("b", 8), "cpu", ProjectLoad{Replicas: 1, Ready: 1}), node("c", 8)},
			current: map[string]Placement{"cpu": {Nodes: shares{"a": {2, 2}, "b": {1, 1}}}},
			want:    map[string]shares{"cpu": {"a": {1, 1}, "b": {1, 1}, "c": {1, 1}}},
		},
		{
			name:     "scale-in: a node with no part of the minimum and nothing of the project leaves",
			projects: []store.Project{project("cpu", 0, 2, 0, 0)},
			nodes:    []NodeInfo{withLoad(node("a", 1), "cpu", ProjectLoad{Replicas: 1, Busy: 1, Max: 1}), node("b", 2)},
			current:  map[string]Placement{"cpu": {Nodes: shares{"a": {0, 1}, "b": {0, 1}}}},
			want:     map[string]shares{"cpu": {"a": {0, 2}}},
		},
		{
			name:     "no scale-in of a node that joined less than scaleInAfter ago",
			projects: []store.Project{project("cpu", 0, 2, 0, 0)},
			nodes:    []NodeInfo{withLoad(node("a", 1), "cpu", ProjectLoad{Replicas: 1, Busy: 1, Max: 1}), node("b", 2)},
			current: map[string]Placement{"cpu": {Nodes: shares{"a": {0, 1}, "b": {0, 1}},
				Joined: map[string]time.Time{"b": placedAt.Add(-scaleInAfter / 2)}}},
			want: map[string]shares{"cpu": {"a": {0, 1}, "b": {0, 1}}},
		},
		{
			name:     "scale-in keeps one node",
			projects: []store.Project{project("cpu", 0, 2, 0, 0)},
			nodes:    []NodeInfo{node("a", 1), node("b", 2)},
			current:  map[string]Placement{"cpu": {Nodes: shares{"a": {0, 1}, "b": {0, 1}}}},
			want:     map[string]shares{"cpu": {"b": {0, 2}}},
		},
		{
			name:     "scale-out: a node at its max with calls queued gets company",
			projects: []store.Project{project("cpu", 0, 2, 0, 0)},
			nodes:    []NodeInfo{withLoad(node("a", 1), "cpu", ProjectLoad{Replicas: 1, Busy: 1, Queued: 3, Max: 1}), node("b", 2)},
			current:  map[string]Placement{"cpu": {Nodes: shares{"a": {0, 2}}}},
			want:     map[string]shares{"cpu": {"a": {0, 1}, "b": {0, 1}}},
		},
		{
			name:     "no scale-out without calls queued",
			projects: []store.Project{project("cpu", 0, 2, 0, 0)},
			nodes:    []NodeInfo{withLoad(node("a", 1), "cpu", ProjectLoad{Replicas: 1, Busy: 1, Max: 1}), node("b", 2)},
			current:  map[string]Placement{"cpu": {Nodes: shares{"a": {0, 2}}}},
			want:     map[string]shares{"cpu": {"a": {0, 2}}},
		},
		{
			name:     "no scale-out past the project's maxReplicas",
			projects: []store.Project{project("cpu", 0, 1, 0, 0)},
			nodes:    []NodeInfo{withLoad(node("a", 1), "cpu", ProjectLoad{Replicas: 1, Busy: 1, Queued: 5, Max: 1}), node("b", 2)},
			current:  map[string]Placement{"cpu": {Nodes: shares{"a": {0, 1}}}},
			want:     map[string]shares{"cpu": {"a": {0, 1}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := place(tc.projects, tc.nodes, tc.current, placedAt)
			if !maps.EqualFunc(got, tc.want, func(a, b map[string]Share) bool { return maps.Equal(a, b) }) {
				t.Errorf("placement = %v, want %v", got, tc.want)
			}
			// The same inputs give the same answer: the leader writes
			// only changes.
			if again := place(tc.projects, tc.nodes, tc.current, placedAt); !maps.EqualFunc(got, again, func(a, b map[string]Share) bool { return maps.Equal(a, b) }) {
				t.Errorf("a second pass gave %v, the first %v", again, got)
			}
		})
	}
}
