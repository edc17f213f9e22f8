package replica

import (
	"os"
	"slices"
	"strings"
	"testing"

	"inferd/store"
)

func TestStartRejectsSpecsItCannotRun(t *testing.T) {
	ok := Spec{ID: "r1", ModelSpec: store.ModelSpec{Command: []string{"true"}}}
	tests := []struct {
		name string
		edit func(*Spec)
		want string
	}{
		{"empty id", func(s *Spec) { s.ID = "" }, "invalid replica id"},
		{"id with slash", func(s *Spec) { s.ID = "../r1" }, "invalid replica id"},
		{"dot dot id", func(s *Spec) { s.ID = ".." }, "invalid replica id"},
		{"no command", func(s *Spec) { s.Command = nil }, "empty command"},
		{"empty program", func(s *Spec) { s.Command = []string{""} }, "empty command"},
		{"unknown protocol", func(s *Spec) { s.Protocol = "grpc" }, `unsupported protocol "grpc"`},
		{"relative health path", func(s *Spec) { s.HealthPath = "healthz" }, "health path"},
		{"relative infer path", func(s *Spec) { s.InferPath = "predict" }, "infer path"},
		{"env name with =", func(s *Spec) { s.Env = map[string]string{"A=B": "1"} }, "invalid env name"},
		{"empty env name", func(s *Spec) { s.Env = map[string]string{"": "1"} }, "invalid env name"},
		{"missing program", func(s *Spec) { s.Command = []string{"/nonexistent/model-server"} }, "no such file"},
		{"run dir not creatable", func(s *Spec) { s.Command = []string{"sleep", "1000"}; s.RunDir = "/dev/null/run" }, "create run dir"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := ok
			spec.RunDir = t.TempDir()
			tc.edit(&spec)
			p, err := Start(spec, testLogger(t))
			if err == nil {
				p.Stop(0)
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
			if files, _ := os.ReadDir(spec.RunDir); len(files) > 0 {
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
	}
	getenv := func(k string) (string, bool) { v, ok := daemon[k]; return v, ok }
	tests := []struct {
		name   string
		spec   Spec
		want   []string // NAME=value that must be present
		absent []string // names that must not be
	}{
		{
			name: "cpu replica",
			spec: Spec{ID: "r1", ProjectID: "p1"},
			want: []string{
				"PATH=/usr/bin:/bin", "HOME=/home/inferd", "LANG=C.UTF-8", "PYENV_ROOT=/root/.pyenv",
				"PORT=8123", "CUDA_VISIBLE_DEVICES=", "NVIDIA_VISIBLE_DEVICES=void",
				"INFERD_PROJECT_ID=p1", "INFERD_REPLICA_ID=r1", "PYTHONUNBUFFERED=1",
			},
			absent: []string{"INFERD_ADMIN_KEY", "INFERD_DATA_DIR", "AWS_SECRET", "LD_PRELOAD", "USER", "TZ"},
		},
		{
			name: "gpu replica",
			spec: Spec{ID: "r2", ProjectID: "p1", GPUUUIDs: []string{"GPU-aaa", "GPU-bbb"}},
			want: []string{"CUDA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb", "NVIDIA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb"},
		},
		{
			name: "project env on top of the base",
			spec: Spec{ID: "r3", ModelSpec: store.ModelSpec{Env: map[string]string{"GREETING": "hi", "PATH": "/opt/model/bin", "PYTHONUNBUFFERED": "0"}}},
			want: []string{"GREETING=hi", "PATH=/opt/model/bin", "PYTHONUNBUFFERED=0"},
		},
		{
			name: "project cannot override inferd's variables",
			spec: Spec{
				ID:        "r4",
				ProjectID: "p4",
				ModelSpec: store.ModelSpec{Env: map[string]string{
					"PORT": "1", "CUDA_VISIBLE_DEVICES": "0", "INFERD_REPLICA_ID": "other", "INFERD_PROJECT_ID": "other",
				}},
			},
			want: []string{"PORT=8123", "CUDA_VISIBLE_DEVICES=", "INFERD_REPLICA_ID=r4", "INFERD_PROJECT_ID=p4"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := tc.spec.environ(8123, getenv)
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

func TestStartAppliesDefaults(t *testing.T) {
	spec, err := Spec{ID: "r1", ModelSpec: store.ModelSpec{Command: []string{"m"}}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	got := []any{spec.Protocol, spec.HealthPath, spec.InferPath, spec.LogMaxBytes, spec.LogKeep}
	want := []any{"http", "/healthz", "/", int64(10 << 20), 3}
	if !slices.Equal(got, want) {
		t.Errorf("defaults = %v, want %v", got, want)
	}
}

// The keep-alive pool must hold a connection for every call a replica may serve at
// once, or calls beyond it reconnect every time.
func TestKeepAlivePoolCoversMaxConcurrency(t *testing.T) {
	if maxIdleConns < store.MaxConcurrency {
		t.Errorf("maxIdleConns = %d, below store.MaxConcurrency %d", maxIdleConns, store.MaxConcurrency)
	}
}
