package store_test

import (
	"errors"
	"strings"
	"testing"

	"inferd/store"
	"inferd/store/storetest"
)

func TestNewProjectDefaults(t *testing.T) {
	p := store.NewProject("p", "t")
	want := store.Project{ID: "p", TeamID: "t", MinReplicas: 0, MaxReplicas: 3, InferenceTimeout: 300, IdleTimeout: 30,
		Model: store.ModelSpec{Protocol: "http", HealthPath: "/healthz", InferPath: "/", BatchPath: "/", Concurrency: 1, BootTimeout: 600}}
	if !store.SameContent(p, want) {
		t.Errorf("NewProject = %+v, want %+v", p, want)
	}
	var q store.Project
	q.Model.Protocol = store.ProtocolPotassium
	q.ApplyDefaults()
	if q.Model.HealthPath != "/__status__" {
		t.Errorf("potassium health path = %q", q.Model.HealthPath)
	}
	// The batch path is the infer path unless set.
	var r store.Project
	r.Model.InferPath = "/predict"
	r.ApplyDefaults()
	if r.Model.BatchPath != "/predict" {
		t.Errorf("batch path = %q, want the infer path /predict", r.Model.BatchPath)
	}
}

func TestProjectValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(*store.Project)
		field  string // "" = valid
		reason string
	}{
		{"defaults are valid", func(*store.Project) {}, "", ""},
		{"id empty", func(p *store.Project) { p.ID = "" }, "id", ""},
		{"id 64 chars", func(p *store.Project) { p.ID = strings.Repeat("a", 64) }, "", ""},
		{"id 65 chars", func(p *store.Project) { p.ID = strings.Repeat("a", 65) }, "id", ""},
		{"id uppercase", func(p *store.Project) { p.ID = "Abc" }, "id", ""},
		{"id underscore", func(p *store.Project) { p.ID = "a_b" }, "id", ""},
		{"id dashes digits", func(p *store.Project) { p.ID = "a-1-b" }, "", ""},
		{"teamId empty", func(p *store.Project) { p.TeamID = "" }, "teamId", ""},
		{"teamId slash", func(p *store.Project) { p.TeamID = "a/b" }, "teamId", ""},
		{"minReplicas -1", func(p *store.Project) { p.MinReplicas = -1 }, "minReplicas", "must be at least 0"},
		{"minReplicas equals max", func(p *store.Project) { p.MinReplicas = 3 }, "", ""},
		{"minReplicas above max", func(p *store.Project) { p.MinReplicas = 4 }, "minReplicas", "must not exceed maxReplicas (3)"},
		{"maxReplicas 0", func(p *store.Project) { p.MaxReplicas = 0 }, "maxReplicas", "must be at least 1"},
		{"maxReplicas 1000", func(p *store.Project) { p.MaxReplicas = 1000 }, "", ""},
		{"maxReplicas 1001", func(p *store.Project) { p.MaxReplicas = 1001 }, "maxReplicas", "must be at most 1000"},
		{"min and max 1000", func(p *store.Project) { p.MinReplicas, p.MaxReplicas = 1000, 1000 }, "", ""},
		{"inferenceTimeout 0", func(p *store.Project) { p.InferenceTimeout = 0 }, "inferenceTimeout", ""},
		{"inferenceTimeout 1", func(p *store.Project) { p.InferenceTimeout = 1 }, "", ""},
		{"inferenceTimeout 86400", func(p *store.Project) { p.InferenceTimeout = 86400 }, "", ""},
		{"inferenceTimeout 86401", func(p *store.Project) { p.InferenceTimeout = 86401 }, "inferenceTimeout", ""},
		{"idleTimeout -1", func(p *store.Project) { p.IdleTimeout = -1 }, "idleTimeout", ""},
		{"idleTimeout 0", func(p *store.Project) { p.IdleTimeout = 0 }, "", ""},
		{"idleTimeout 86400", func(p *store.Project) { p.IdleTimeout = 86400 }, "", ""},
		{"idleTimeout 86401", func(p *store.Project) { p.IdleTimeout = 86401 }, "idleTimeout", ""},
		{"command nil", func(p *store.Project) { p.Model.Command = nil }, "model.command", "must not be empty (unless the project names an image, whose Entrypoint and Cmd it then runs)"},
		{"command nil with an image", func(p *store.Project) { p.Model.Command, p.Model.Image = nil, "sha256:0123456789ab" }, "", ""},
		{"command empty string with an image", func(p *store.Project) { p.Model.Command, p.Model.Image = []string{""}, "sha256:0123456789ab" }, "model.command", ""},
		{"image by path", func(p *store.Project) { p.Model.Image = "/srv/images/llm.tar" }, "", ""},
		{"python", func(p *store.Project) {
			p.Model.Python = store.PythonSpec{Requirements: "/srv/m/requirements.txt", Wheelhouse: "/srv/wheels"}
		}, "", ""},
		{"python without requirements", func(p *store.Project) { p.Model.Python = store.PythonSpec{Wheelhouse: "/srv/wheels"} }, "model.python.requirements", ""},
		{"python relative wheelhouse", func(p *store.Project) {
			p.Model.Python = store.PythonSpec{Requirements: "/r.txt", Wheelhouse: "wheels"}
		}, "model.python.wheelhouse", ""},
		{"python with an image", func(p *store.Project) {
			p.Model.Python, p.Model.Image = store.PythonSpec{Requirements: "/r.txt"}, "sha256:0123456789ab"
		}, "model.python", ""},
		{"image relative path", func(p *store.Project) { p.Model.Image = "llm.tar" }, "model.image", ""},
		{"image ID too short", func(p *store.Project) { p.Model.Image = "sha256:0123" }, "model.image", ""},
		{"image ID not hex", func(p *store.Project) { p.Model.Image = "sha256:0123456789xyz" }, "model.image", ""},
		{"command empty string", func(p *store.Project) { p.Model.Command = []string{""} }, "model.command", ""},
		{"protocol empty", func(p *store.Project) { p.Model.Protocol = "" }, "model.protocol", ""},
		{"protocol potassium", func(p *store.Project) { p.Model.Protocol = "potassium" }, "", ""},
		{"protocol grpc", func(p *store.Project) { p.Model.Protocol = "grpc" }, "model.protocol", ""},
		{"gpus -1", func(p *store.Project) { p.Model.GPUs = -1 }, "model.gpus", ""},
		{"gpus 64", func(p *store.Project) { p.Model.GPUs = 64 }, "", ""},
		{"gpus 65", func(p *store.Project) { p.Model.GPUs = 65 }, "model.gpus", ""},
		{"gpuMemoryMiB -1", func(p *store.Project) { p.Model.GPUMemoryMiB = -1 }, "model.gpuMemoryMiB", ""},
		{"gpuMemoryMiB 0", func(p *store.Project) { p.Model.GPUMemoryMiB = 0 }, "", ""},
		{"concurrency 0", func(p *store.Project) { p.Model.Concurrency = 0 }, "model.concurrency", ""},
		{"concurrency 1000", func(p *store.Project) { p.Model.Concurrency = 1000 }, "", ""},
		{"concurrency 1001", func(p *store.Project) { p.Model.Concurrency = 1001 }, "model.concurrency", ""},
		{"potassium concurrency 1", func(p *store.Project) { p.Model.Protocol = store.ProtocolPotassium }, "", ""},
		{"potassium concurrency 2", func(p *store.Project) { p.Model.Protocol = store.ProtocolPotassium; p.Model.Concurrency = 2 }, "model.concurrency",
			`must be 1 for protocol "potassium": a Potassium app runs one call at a time on its single worker (raise maxReplicas to serve more at once)`},
		{"bootTimeout 0", func(p *store.Project) { p.Model.BootTimeout = 0 }, "model.bootTimeout", ""},
		{"bootTimeout 86400", func(p *store.Project) { p.Model.BootTimeout = 86400 }, "", ""},
		{"bootTimeout 86401", func(p *store.Project) { p.Model.BootTimeout = 86401 }, "model.bootTimeout", ""},
		{"memoryMiB 0 (no limit)", func(p *store.Project) { p.Model.MemoryMiB = 0 }, "", ""},
		{"memoryMiB 15", func(p *store.Project) { p.Model.MemoryMiB = 15 }, "model.memoryMiB", ""},
		{"memoryMiB 16", func(p *store.Project) { p.Model.MemoryMiB = 16 }, "", ""},
		{"pidsMax -1", func(p *store.Project) { p.Model.PidsMax = -1 }, "model.pidsMax", ""},
		{"pidsMax 64", func(p *store.Project) { p.Model.PidsMax = 64 }, "", ""},
		{"network host", func(p *store.Project) { p.Model.Network = "host" }, "", ""},
		{"network private", func(p *store.Project) { p.Model.Network = "private" }, "", ""},
		{"network bridge", func(p *store.Project) { p.Model.Network = "bridge" }, "model.network", ""},
		{"keyHash empty", func(p *store.Project) { p.Model.KeyHash = "" }, "model.keyHash", ""},
		{"keyHash short", func(p *store.Project) { p.Model.KeyHash = p.Model.KeyHash[:63] }, "model.keyHash", ""},
		{"keyHash uppercase", func(p *store.Project) { p.Model.KeyHash = strings.ToUpper(p.Model.KeyHash) }, "model.keyHash", ""},
		{"keyHash not hex", func(p *store.Project) { p.Model.KeyHash = strings.Repeat("g", 64) }, "model.keyHash", ""},
		{"dir relative", func(p *store.Project) { p.Model.Dir = "models/a" }, "model.dir", ""},
		{"dir absolute", func(p *store.Project) { p.Model.Dir = "/srv/models/a" }, "", ""},
		{"healthPath relative", func(p *store.Project) { p.Model.HealthPath = "healthz" }, "model.healthPath", ""},
		{"inferPath relative", func(p *store.Project) { p.Model.InferPath = "infer" }, "model.inferPath", ""},
		{"env name with =", func(p *store.Project) { p.Model.Env = map[string]string{"A=B": "c"} }, "model.env", ""},
		{"env ok", func(p *store.Project) { p.Model.Env = map[string]string{"HF_HOME": "/x"} }, "", ""},
		{"env value with NUL", func(p *store.Project) { p.Model.Env = map[string]string{"A": "b\x00c"} }, "model.env", ""},
		{"command arg with NUL", func(p *store.Project) { p.Model.Command = []string{"/bin/model", "--x\x00"} }, "model.command", ""},
		{"dir with NUL", func(p *store.Project) { p.Model.Dir = "/srv/\x00" }, "model.dir", ""},
		{"batchPath relative", func(p *store.Project) { p.Model.BatchPath = "batch" }, "model.batchPath", "must start with /"},
		{"batch off", func(p *store.Project) { p.Model.Batch = store.BatchSpec{} }, "", ""},
		{"parkTimeout -1", func(p *store.Project) { p.Model.ParkTimeout = -1 }, "model.parkTimeout", "must be between 0 (never park) and 86400 seconds"},
		{"parkTimeout 86400", func(p *store.Project) { p.Model.ParkTimeout = 86400 }, "", ""},
		{"parkTimeout 86401", func(p *store.Project) { p.Model.ParkTimeout = 86401 }, "model.parkTimeout", ""},
		{"batch maxSize 2", func(p *store.Project) { p.Model.Batch = store.BatchSpec{MaxSize: 2} }, "", ""},
		{"batch maxSize 1024 maxWaitMs 10000", func(p *store.Project) { p.Model.Batch = store.BatchSpec{MaxSize: 1024, MaxWaitMs: 10000} }, "", ""},
		{"batch maxSize 1", func(p *store.Project) { p.Model.Batch = store.BatchSpec{MaxSize: 1, MaxWaitMs: 5} }, "model.batch.maxSize",
			"must be between 2 and 1024 (leave batch out to send one call at a time)"},
		{"batch maxWaitMs without maxSize", func(p *store.Project) { p.Model.Batch = store.BatchSpec{MaxWaitMs: 5} }, "model.batch.maxSize", ""},
		{"batch maxSize 1025", func(p *store.Project) { p.Model.Batch = store.BatchSpec{MaxSize: 1025} }, "model.batch.maxSize", ""},
		{"batch maxWaitMs -1", func(p *store.Project) { p.Model.Batch = store.BatchSpec{MaxSize: 4, MaxWaitMs: -1} }, "model.batch.maxWaitMs", "must be between 0 and 10000"},
		{"batch maxWaitMs 10001", func(p *store.Project) { p.Model.Batch = store.BatchSpec{MaxSize: 4, MaxWaitMs: 10001} }, "model.batch.maxWaitMs", ""},
		{"potassium batch", func(p *store.Project) {
			p.Model.Protocol = store.ProtocolPotassium
			p.Model.Batch = store.BatchSpec{MaxSize: 4}
		}, "model.batch", `protocol "potassium" cannot batch: a Potassium handler answers one call per request (use protocol http with a batchPath, or leave batch out)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := storetest.Project("p", "t")
			tc.edit(&p)
			err := p.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			var ve *store.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate = %v, want *ValidationError", err)
			}
			if ve.Field != tc.field {
				t.Errorf("field = %q, want %q (%v)", ve.Field, tc.field, err)
			}
			if tc.reason != "" && ve.Reason != tc.reason {
				t.Errorf("reason = %q, want %q", ve.Reason, tc.reason)
			}
			if !strings.HasPrefix(err.Error(), tc.field+": ") {
				t.Errorf("Error() = %q, want it to start with %q", err, tc.field+": ")
			}
		})
	}
}

// One rule says what a replica holds of GPUs, read by the scheduler, the
// cluster leader, quotas, the status and apply: gpuMemoryMiB alone is a
// share of one GPU, never a CPU replica.
func TestGPUDemand(t *testing.T) {
	for _, tc := range []struct {
		gpus, mem int
		want      store.GPUDemand
	}{
		{0, 0, store.GPUDemand{}},
		{2, 0, store.GPUDemand{GPUs: 2}},
		{0, 4096, store.GPUDemand{GPUs: 1, MemoryMiB: 4096}},
		{2, 4096, store.GPUDemand{GPUs: 2, MemoryMiB: 4096}},
	} {
		if got := (store.ModelSpec{GPUs: tc.gpus, GPUMemoryMiB: tc.mem}).GPUDemand(); got != tc.want {
			t.Errorf("GPUDemand(gpus %d, gpuMemoryMiB %d) = %+v, want %+v", tc.gpus, tc.mem, got, tc.want)
		}
	}
}
