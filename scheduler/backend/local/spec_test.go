package local

import (
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

func TestStartRejectsSpecsItCannotRun(t *testing.T) {
	tests := []struct {
		name string
		edit func(*backend.Spec, *Config)
		want string
	}{
		{"empty id", func(s *backend.Spec, _ *Config) { s.ReplicaID = "" }, "invalid replica id"},
		{"id with slash", func(s *backend.Spec, _ *Config) { s.ReplicaID = "../r1" }, "invalid replica id"},
		{"dot dot id", func(s *backend.Spec, _ *Config) { s.ReplicaID = ".." }, "invalid replica id"},
		{"project id with slash", func(s *backend.Spec, _ *Config) { s.ProjectID = "../p" }, "invalid project id"},
		{"dot dot team", func(s *backend.Spec, _ *Config) { s.TeamID = ".." }, "invalid team id"},
		{"no command", func(s *backend.Spec, _ *Config) { s.Model.Command = nil }, "empty command"},
		{"empty program", func(s *backend.Spec, _ *Config) { s.Model.Command = []string{""} }, "empty command"},
		{"unknown protocol", func(s *backend.Spec, _ *Config) { s.Model.Protocol = "grpc" }, `unsupported protocol "grpc"`},
		{"relative health path", func(s *backend.Spec, _ *Config) { s.Model.HealthPath = "healthz" }, "health path"},
		{"relative infer path", func(s *backend.Spec, _ *Config) { s.Model.InferPath = "predict" }, "infer path"},
		{"env name with =", func(s *backend.Spec, _ *Config) { s.Model.Env = map[string]string{"A=B": "1"} }, "invalid env name"},
		{"empty env name", func(s *backend.Spec, _ *Config) { s.Model.Env = map[string]string{"": "1"} }, "invalid env name"},
		{"missing program", func(s *backend.Spec, _ *Config) { s.Model.Command = []string{"/nonexistent/model-server"} }, "no such file"},
		{"run dir not creatable", func(s *backend.Spec, c *Config) {
			s.Model.Command = []string{"sleep", "1000"}
			c.RunDir = "/dev/null/run"
		}, "create run dir"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := testBackend(t)
			spec := shSpec("r1", "")
			spec.Model.Command = []string{"true"}
			tc.edit(&spec, &b.cfg)
			inst, err := b.Launch(spec)
			if err == nil {
				inst.Stop()
				t.Fatal("Launch succeeded")
			}
			if inst != nil {
				t.Errorf("a failed Launch returned an Instance: %#v", inst)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
			if files, _ := os.ReadDir(b.cfg.RunDir); len(files) > 0 {
				t.Errorf("run dir not empty after a failed start: %v", files)
			}
		})
	}
}

func TestEnvironHoldsAllowlistProjectEnvAndInferdVariables(t *testing.T) {
	daemon := map[string]string{
		"PATH":             "/usr/bin:/bin",
		"HOME":             "/home/inferd",
		"LANG":             "C.UTF-8",
		"PYENV_ROOT":       "/root/.pyenv",
		"INFERD_ADMIN_KEY": "ik_secret",
		"INFERD_DATA_DIR":  "/var/lib/inferd",
		"AWS_SECRET":       "nope",
		"LD_PRELOAD":       "/evil.so",
		"PORT":             "9999",
		"LD_LIBRARY_PATH":  "/usr/local/nvidia/lib64",
		"CUDA_HOME":        "/usr/local/cuda",
	}
	getenv := func(k string) (string, bool) { v, ok := daemon[k]; return v, ok }
	tests := []struct {
		name   string
		spec   backend.Spec
		dir    string   // the private directory
		runAs  *RunAs   // who the model runs as
		pass   []string // replica.passEnv
		want   []string // NAME=value that must be present
		absent []string // names that must not be
	}{
		{
			name: "cpu replica",
			spec: backend.Spec{ReplicaID: "r1", ProjectID: "p1"},
			want: []string{
				"PATH=/usr/bin:/bin", "HOME=/home/inferd", "LANG=C.UTF-8", "PYENV_ROOT=/root/.pyenv",
				"PORT=8123", "CUDA_VISIBLE_DEVICES=", "NVIDIA_VISIBLE_DEVICES=void",
				"INFERD_PROJECT_ID=p1", "INFERD_REPLICA_ID=r1", "PYTHONUNBUFFERED=1",
			},
			absent: []string{"INFERD_ADMIN_KEY", "INFERD_DATA_DIR", "AWS_SECRET", "LD_PRELOAD", "USER", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME"},
		},
		{
			name:   "replica.passEnv adds variables, and only those set",
			spec:   backend.Spec{ReplicaID: "r5"},
			pass:   []string{"LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"},
			want:   []string{"LD_LIBRARY_PATH=/usr/local/nvidia/lib64", "CUDA_HOME=/usr/local/cuda", "PATH=/usr/bin:/bin"},
			absent: []string{"CUDA_PATH", "AWS_SECRET"},
		},
		{
			name: "replica.passEnv cannot override inferd's variables",
			spec: backend.Spec{ReplicaID: "r6"},
			pass: []string{"PORT"},
			want: []string{"PORT=8123"},
		},
		{
			name: "gpu replica",
			spec: backend.Spec{ReplicaID: "r2", ProjectID: "p1", GPUs: []string{"GPU-aaa", "GPU-bbb"}},
			want: []string{"CUDA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb", "NVIDIA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb"},
		},
		{
			name: "project env on top of the base",
			spec: backend.Spec{ReplicaID: "r3", Model: store.ModelSpec{Env: map[string]string{"GREETING": "hi", "PATH": "/opt/model/bin", "PYTHONUNBUFFERED": "0"}}},
			want: []string{"GREETING=hi", "PATH=/opt/model/bin", "PYTHONUNBUFFERED=0"},
		},
		{
			name: "private HOME and TMPDIR, and the model user's name",
			spec: backend.Spec{ReplicaID: "r5", ProjectID: "p5"},
			dir:  "/tmp/inferd-0-x/r5", runAs: perProjectRunAs(61200),
			want: []string{"HOME=/tmp/inferd-0-x/r5", "TMPDIR=/tmp/inferd-0-x/r5", "USER=61200", "LOGNAME=61200"},
		},
		{
			name: "the project may move HOME and TMPDIR",
			spec: backend.Spec{ReplicaID: "r6", Model: store.ModelSpec{Env: map[string]string{"HOME": "/srv/cache", "TMPDIR": "/scratch"}}},
			dir:  "/tmp/inferd-0-x/r6",
			want: []string{"HOME=/srv/cache", "TMPDIR=/scratch"},
		},
		{
			name: "project cannot override inferd's variables",
			spec: backend.Spec{ReplicaID: "r4", ProjectID: "p4", Model: store.ModelSpec{Env: map[string]string{
				"PORT": "1", "CUDA_VISIBLE_DEVICES": "0", "INFERD_REPLICA_ID": "other", "INFERD_PROJECT_ID": "other",
			}}},
			want: []string{"PORT=8123", "CUDA_VISIBLE_DEVICES=", "INFERD_REPLICA_ID=r4", "INFERD_PROJECT_ID=p4"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := environ(tc.spec, tc.spec.Model.Env, 8123, tc.runAs, tc.dir, tc.pass, getenv)
			if !slices.IsSorted(env) {
				t.Errorf("environment not sorted: %v", env)
			}
			for _, kv := range tc.want {
				if !slices.Contains(env, kv) {
					t.Errorf("missing %s in %v", kv, env)
				}
			}
			for _, name := range tc.absent {
				for _, kv := range env {
					if strings.HasPrefix(kv, name+"=") {
						t.Errorf("%s leaked into the model's environment", kv)
					}
				}
			}
		})
	}
}

func TestNewAppliesDefaults(t *testing.T) {
	b, err := New(Config{User: "root"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	got := []any{b.cfg.LogMaxBytes, b.cfg.LogKeep, b.cfg.StopGrace, b.Capacity().CPUSlots, len(b.Capacity().GPUs)}
	want := []any{int64(10 << 20), 3, 10 * time.Second, runtime.NumCPU(), 0}
	if !slices.Equal(got, want) {
		t.Errorf("defaults = %v, want %v", got, want)
	}
}
