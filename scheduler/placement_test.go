package scheduler

import (
	"slices"
	"testing"

	"inferd/gpu"
)

func TestPlaceWholeGPUs(t *testing.T) {
	four := []gpu.Device{{Index: 2, UUID: "C"}, {Index: 0, UUID: "A"}, {Index: 3, UUID: "D"}, {Index: 1, UUID: "B"}}
	for _, tc := range []struct {
		name    string
		devices []gpu.Device
		held    []assignment
		gpus    int
		want    []string
		ok      bool
	}{
		{"cpu replica needs nothing", nil, nil, 0, nil, true},
		{"no GPUs", nil, nil, 1, nil, false},
		{"lowest index first", four, nil, 1, []string{"A"}, true},
		{"skips held GPUs", four, []assignment{{replica: "p-1", gpus: []string{"A", "C"}}}, 2, []string{"B", "D"}, true},
		{"multi-GPU replica", four, nil, 3, []string{"A", "B", "C"}, true},
		{"not enough free", four, []assignment{{replica: "p-1", gpus: []string{"A", "B", "C"}}}, 2, nil, false},
		{"all taken", four[:1], []assignment{{replica: "p-1", gpus: []string{"C"}}}, 1, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := place(tc.devices, tc.held, placementRequest{gpus: tc.gpus})
			if ok != tc.ok || !slices.Equal(got, tc.want) {
				t.Errorf("place = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
