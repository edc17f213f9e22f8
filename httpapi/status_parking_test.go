package httpapi

import (
	"testing"
	"time"

	"inferd/gpu"
	"inferd/httpapi/status"
	"inferd/scheduler"
)

// A parked replica's GPU shows free on the status (nobody holds it), and
// the replica shows parked, since when, and why its project parks no more.
func TestStatusShowsParkedReplicasAndTheirGPUFree(t *testing.T) {
	devs := gpu.Simulated([]gpu.SimulatedGPU{{Name: "Sim A"}}).Devices()
	parked := statusNow.Add(-time.Minute)
	snap := scheduler.Status{Projects: []scheduler.ProjectStatus{
		{ID: "echo", TeamID: "acme", ParkingOff: "parking failed: cuCheckpointProcessLock: CUDA_ERROR_TIMEOUT",
			Replicas: []scheduler.ReplicaStatus{{ID: "echo-1", State: "parked", Pid: 4242, GPUs: []string{devs[0].UUID},
				Started: statusNow.Add(-time.Hour), ParkedSince: parked}}},
	}, GPUs: []scheduler.GPUStatus{{UUID: devs[0].UUID, Replicas: []string{}}}}
	env := newEnv(t, Options{Status: &status.Sources{
		Snapshot: func() scheduler.Status { return snap },
		GPUs:     func() []gpu.Device { return devs },
		Calls:    fakeCalls{},
		Now:      func() time.Time { return statusNow },
	}})
	gpus := decode[status.Results[status.GPU]](t, serve(env.h, "GET", "/v1/status/gpus", "", "X-Service-API-Key", keyAcme))
	if g := gpus.Results[0]; g.Held || g.HeldBy != nil || g.MemoryReservedBytes != 0 {
		t.Errorf("GPU 0 = %+v, want free: its one replica is parked", g)
	}
	projects := decode[status.Results[status.Project]](t, serve(env.h, "GET", "/v1/status/projects", "", "X-Service-API-Key", keyAcme))
	echo := projects.Results[0]
	if echo.ParkingOff == "" {
		t.Errorf("echo = %+v, want why it parks no more", echo)
	}
	r := echo.Replicas[0]
	if r.State != "parked" || r.ParkedSince == nil || !r.ParkedSince.Equal(parked) || len(r.GPUs) != 1 {
		t.Errorf("replica = %+v", r)
	}
}
