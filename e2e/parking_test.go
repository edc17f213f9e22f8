package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Parking end to end (docs/gpu.md "Parking"): the real binary on one
// simulated GPU, built with failpoints so that INFERD_FAKE_CHECKPOINT stands
// in for the CUDA driver's checkpoint API. Everything else is real: the
// scheduler's parkTimeout, the replica's freezing (its cgroup v2 freezer,
// or SIGSTOP), the GPU handed to another project meanwhile, the restore on
// the next call, the status and metrics. On a GPU box scripts/gpu-check.sh
// parks a real CUDA process.

// parkingDaemon starts a failpoints daemon with one simulated GPU whose
// fake checkpoint behaves as mode says, and applies projects.
func parkingDaemon(t *testing.T, mode, projects string) (*daemon, inferenceClient, string) {
	t.Helper()
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(30*time.Second)+"\nreplica:\n  stopGrace: 2s\n  restartBackoff: 100ms\ngpu:\n  simulate:\n    - {name: Sim A, memoryMiB: 16384}\n")
	d := startDaemonWith(t, dir, cfg, failpointBinary(t), "INFERD_REPLICA_USER=root", "INFERD_FAKE_CHECKPOINT="+mode)
	admin := d.createKey("admin", true)
	if projects != "" {
		d.apply("projects:\n" + projects)
	}
	return d, inferenceClient{t: t, base: d.base, key: d.createKey("acme", false)}, admin
}

// parkedProject is an echo project on a whole GPU that parks after 1 s idle.
func parkedProject(echo, mark string) string {
	return echoProject("warm", "acme", "mk-warm", echo, mark, "") + "    gpus: 1\n    maxReplicas: 1\n    idleTimeout: 600\n    parkTimeout: 1\n"
}

// replicaOf runs a call on the project and returns the id of the replica
// that answered it.
func replicaOf(t *testing.T, c inferenceClient, modelKey string) string {
	t.Helper()
	r := c.start(modelKey, `{}`, false)
	if r["message"] != "success" {
		t.Fatalf("%s: %v", modelKey, r)
	}
	id, _ := output(t, r)["replica"].(string)
	return id
}

// cgroupFrozen reports whether pid's cgroup v2 is frozen; ok is false when
// it has none this test can find (then it is frozen by SIGSTOP: state T).
func cgroupFrozen(pid int) (frozen, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		path, found := strings.CutPrefix(line, "0::")
		if !found {
			continue
		}
		for _, mount := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
			if ev, err := os.ReadFile(filepath.Join(mount, path, "cgroup.events")); err == nil {
				return strings.Contains(string(ev), "frozen 1"), true
			}
		}
	}
	return false, false
}

// gpuHeld reports whether the status says a replica holds the simulated GPU.
func gpuHeld(t *testing.T, d *daemon, key string) bool {
	t.Helper()
	code, body := doRaw(t, "GET", d.base+"/v1/status/gpus", map[string]string{"X-Service-API-Key": key}, "")
	var gpus struct {
		Results []struct {
			Held bool `json:"held"`
		} `json:"results"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &gpus) != nil || len(gpus.Results) != 1 {
		t.Fatalf("GET /v1/status/gpus: HTTP %d %s", code, body)
	}
	return gpus.Results[0].Held
}

func TestParkingEndToEnd(t *testing.T) {
	echo := echoDir(t)
	t.Run("an idle replica parks, its GPU serves another project, a call restores it", func(t *testing.T) {
		t.Parallel()
		mark := marker()
		d, c, admin := parkingDaemon(t, "ok", parkedProject(echo, mark)+
			echoProject("other", "acme", "mk-other", echo, mark, "")+"    gpus: 1\n    maxReplicas: 1\n    idleTimeout: 0\n")
		warm := replicaOf(t, c, "mk-warm")
		d.logs.waitFor(t, `"replica parked; its GPUs are free"`, 30*time.Second)
		if got := d.replicaStates(admin, "warm"); len(got) != 1 || got[0] != "parked" {
			t.Fatalf("warm's replicas: %v, want one parked", got)
		}
		pids := processesWithEnv(mark) // the model's, as the host sees it
		if len(pids) != 1 {
			t.Fatalf("warm's model processes: %v, want one", pids)
		}
		pid := pids[0]
		switch frozen, inCgroup := cgroupFrozen(pid); {
		case inCgroup && !frozen:
			t.Error("the parked replica's cgroup is not frozen")
		case !inCgroup:
			if _, state := procState(pid); state != 'T' {
				t.Errorf("the parked replica (no cgroup v2) is in state %c, want T (stopped)", state)
			}
		}
		if gpuHeld(t, d, admin) {
			t.Error("the GPU shows held while its one replica is parked")
		}
		if got := d.metric(t, `inferd_replicas{project="warm",state="parked"}`); got != "1" {
			t.Errorf(`inferd_replicas{state="parked"} = %s, want 1`, got)
		}

		// The parked replica's whole GPU goes to another project; its
		// replica stops right after its call (idleTimeout 0).
		if other := replicaOf(t, c, "mk-other"); other != "other-1" {
			t.Fatalf("other's call ran on %q", other)
		}
		eventually(t, 30*time.Second, "other's replica stops", func() bool { return len(d.replicaStates(admin, "other")) == 0 })

		if again := replicaOf(t, c, "mk-warm"); again != warm {
			t.Errorf("warm's call after parking ran on %s, want the restored %s (not a cold boot)", again, warm)
		}
		d.logs.waitFor(t, `"replica restored"`, 10*time.Second)
		if got := d.replicaStates(admin, "warm"); len(got) != 1 || got[0] == "parked" {
			t.Errorf("after the call warm's replicas are %v", got)
		}
		if frozen, ok := cgroupFrozen(pid); ok && frozen {
			t.Error("the restored replica's cgroup is still frozen")
		}
		if got := d.metric(t, `inferd_replica_restore_seconds_count{project="warm"}`); got != "1" {
			t.Errorf("restores counted %s, want 1", got)
		}
	})
	t.Run("a failed restore falls back to a cold boot", func(t *testing.T) {
		t.Parallel()
		mark := marker()
		d, c, _ := parkingDaemon(t, "fail-restore", parkedProject(echo, mark))
		first := replicaOf(t, c, "mk-warm")
		pids := processesWithEnv(mark)
		d.logs.waitFor(t, `"replica parked; its GPUs are free"`, 30*time.Second)
		if again := replicaOf(t, c, "mk-warm"); again == first || again == "" {
			t.Errorf("after a failed restore the call ran on %q, want a fresh replica (not %s)", again, first)
		}
		if got := d.metric(t, `inferd_replica_restore_failures_total{project="warm",reason="failed"}`); got != "1" {
			t.Errorf("restore failures %s, want 1", got)
		}
		eventually(t, 10*time.Second, "the replica that failed to restore is gone", func() bool { return len(pids) == 1 && !processAlive(pids[0]) })
	})
	t.Run("a box that cannot park says so at apply and keeps replicas warm", func(t *testing.T) {
		t.Parallel()
		mark := marker()
		d, c, admin := parkingDaemon(t, "unsupported", "")
		out := d.apply("projects:\n" + parkedProject(echo, mark))
		if !strings.Contains(out, "warning: project warm: parkTimeout: 1, but replicas cannot be parked here") {
			t.Errorf("apply said:\n%s", out)
		}
		warm := replicaOf(t, c, "mk-warm")
		d.logs.waitFor(t, `"parking off for this project`, 30*time.Second)
		if got := d.replicaStates(admin, "warm"); len(got) != 1 || got[0] != "ready" {
			t.Errorf("warm's replicas: %v, want one ready", got)
		}
		if again := replicaOf(t, c, "mk-warm"); again != warm {
			t.Errorf("the call ran on %s, want the warm replica %s", again, warm)
		}
	})
}

// procState reads pid's state letter from /proc; ok false once it is gone.
func procState(pid int) (ok bool, state byte) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false, 0
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 || i+2 >= len(data) {
		return false, 0
	}
	return true, data[i+2]
}

// processAlive reports whether pid runs (a zombie does not).
func processAlive(pid int) bool {
	ok, state := procState(pid)
	return ok && state != 'Z'
}
