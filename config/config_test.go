package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDefaultsWithoutFile(t *testing.T) {
	cfg, err := Load("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.DataDir != "./data" || cfg.StartWait != 50*time.Second ||
		cfg.MaxQueuedPerProject != 1000 || cfg.ResultTTL != 24*time.Hour || cfg.MaxBodyBytes != 10<<20 {
		t.Fatalf("unexpected defaults: %+v", cfg)
	}
}

func TestExampleFileMatchesDefaults(t *testing.T) {
	fromFile, err := Load("../config.example.yaml", nil, nil)
	if err != nil {
		t.Fatalf("config.example.yaml must load: %v", err)
	}
	defaults, err := Load("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The example's relative dataDir is resolved against its directory.
	fromFile.DataDir, defaults.DataDir = "", ""
	if fromFile.GPU.Simulate == nil {
		fromFile.GPU.Simulate = defaults.GPU.Simulate
	}
	if !reflect.DeepEqual(fromFile, defaults) {
		t.Fatalf("config.example.yaml drifted from the defaults:\nfile:     %+v\ndefaults: %+v", fromFile, defaults)
	}
}

func TestPrecedenceFileEnvFlag(t *testing.T) {
	path := writeFile(t, "listen: 127.0.0.1:9000\nstartWait: 10\nlog:\n  level: debug\nreplica:\n  stopGrace: 3s\n")
	tests := []struct {
		name       string
		env        []string
		flags      map[string]string
		wantListen string
		wantLevel  string
	}{
		{"file over defaults", nil, nil, "127.0.0.1:9000", "debug"},
		{"env over file", []string{"INFERD_LISTEN=127.0.0.1:9001", "INFERD_LOG_LEVEL=warn"}, nil, "127.0.0.1:9001", "warn"},
		{"flag over env", []string{"INFERD_LISTEN=127.0.0.1:9001"}, map[string]string{"listen": "127.0.0.1:9002"}, "127.0.0.1:9002", "debug"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(path, tc.env, tc.flags)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Listen != tc.wantListen || cfg.Log.Level != tc.wantLevel {
				t.Fatalf("listen %q level %q, want %q %q", cfg.Listen, cfg.Log.Level, tc.wantListen, tc.wantLevel)
			}
			if cfg.StartWait != 10*time.Second || cfg.Replica.StopGrace != 3*time.Second {
				t.Fatalf("durations: startWait %s stopGrace %s", cfg.StartWait, cfg.Replica.StopGrace)
			}
		})
	}
}

func TestRelativeDataDirIsRelativeToFile(t *testing.T) {
	path := writeFile(t, "dataDir: ./d\n")
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(filepath.Dir(path), "d"); cfg.DataDir != want {
		t.Fatalf("dataDir %q, want %q", cfg.DataDir, want)
	}
	cfg, err = Load(path, []string{"INFERD_DATADIR=rel"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "rel" {
		t.Fatalf("env dataDir should stay as given, got %q", cfg.DataDir)
	}
}

func TestSimulatedGPUs(t *testing.T) {
	path := writeFile(t, "gpu:\n  simulate:\n    - {name: A, memoryMiB: 1024}\n    - {name: B, memoryMiB: 2048}\n")
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.GPU.Simulate) != 2 || cfg.GPU.Simulate[1].Name != "B" || cfg.GPU.Simulate[1].MemoryMiB != 2048 {
		t.Fatalf("simulate = %+v", cfg.GPU.Simulate)
	}
}

func TestPassEnvFromFile(t *testing.T) {
	tests := []struct {
		name string
		file string
		env  []string
		want []string
	}{
		{"default", "", nil, []string{"LD_LIBRARY_PATH"}},
		{"file list", "replica:\n  passEnv: [LD_LIBRARY_PATH, CUDA_HOME]\n", nil, []string{"LD_LIBRARY_PATH", "CUDA_HOME"}},
		{"file empty list", "replica:\n  passEnv: []\n", nil, []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(writeFile(t, tc.file), tc.env, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.Replica.PassEnv, tc.want) {
				t.Errorf("passEnv = %q, want %q", cfg.Replica.PassEnv, tc.want)
			}
		})
	}
}

func TestInvalidSettingsNameTheKey(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		env     []string
		wantKey string
	}{
		{"unknown top-level key", "listn: 127.0.0.1:1\n", nil, "listn"},
		{"unknown nested key", "replica:\n  stopGrase: 1s\n", nil, "replica.stopGrase"},
		{"bad duration", "startWait: soon\n", nil, "startWait"},
		{"negative duration", "longPollWait: -1s\n", nil, "longPollWait"},
		{"wait over 10m", "longPollWait: 11m\n", nil, "config: longPollWait: must be at most 10m"},
		{"bad listen", "listen: nowhere\n", nil, "listen"},
		{"bad level", "log:\n  level: loud\n", nil, "log.level"},
		{"bad env value", "", []string{"INFERD_MAXQUEUEDPERPROJECT=lots"}, "maxQueuedPerProject"},
		{"zero queue", "maxQueuedPerProject: 0\n", nil, "maxQueuedPerProject"},
		{"queued bytes below the body cap", "maxQueuedBytesPerProject: 1000\n", nil, "maxQueuedBytesPerProject: must be at least maxBodyBytes"},
		{"simulated gpu without memory", "gpu:\n  simulate:\n    - {name: A}\n", nil, "gpu.simulate[0]"},
		{"uid range with root", "replica:\n  uidRange: 0-100\n", nil, "replica.uidRange: \"0-100\" includes uid 0"},
		{"uid range backwards", "replica:\n  uidRange: 70000-60000\n", nil, "replica.uidRange: \"70000-60000\" ends before"},
		{"uid range not a range", "", []string{"INFERD_REPLICA_UIDRANGE=61184"}, "replica.uidRange"},
		{"unknown network", "replica:\n  network: bridge\n", nil, "replica.network"},
		{"log budget below one log", "replica:\n  logMaxBytesPerProject: 4096\n", nil, "replica.logMaxBytesPerProject"},
		{"passEnv with a value", "replica:\n  passEnv: [LD_LIBRARY_PATH=/x]\n", nil, "replica.passEnv"},
		{"passEnv of inferd's own", "replica:\n  passEnv: [PATH, INFERD_ADMIN_KEY]\n", nil, "replica.passEnv"},
		{"passEnv from the environment", "", []string{"INFERD_REPLICA_PASSENV=PATH"}, "replica.passEnv"},
		{"body budget below two bodies", "maxBodyBytes: 52428800\n", nil, "limits.bodyBytesPerSource: must be 0 (no cap) or at least twice maxBodyBytes (104857600)"},
		{"negative body budget", "limits:\n  bodyBytes: -1\n", nil, "limits.bodyBytes"},
		{"no body read timeout", "limits:\n  bodyReadTimeout: 0s\n", nil, "limits.bodyReadTimeout"},
		{"negative stream cap", "", []string{"INFERD_LIMITS_MAXSTREAMSPERKEY=-1"}, "limits.maxStreamsPerKey"},
		{"negative stream result budget", "limits:\n  streamResultBytes: -5\n", nil, "limits.streamResultBytes"},
		{"memory limit the collector would run at all the time", "limits:\n  memoryBytes: 1048576\n", nil, "limits.memoryBytes: must be 0 (derived from bodyBytes and replyBytes) or at least 67108864"},
		{"no stream write timeout", "limits:\n  streamWriteTimeout: 0\n", nil, "limits.streamWriteTimeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeFile(t, tc.file), tc.env, nil)
			if err == nil {
				t.Fatal("want an error")
			}
			if !strings.Contains(err.Error(), tc.wantKey) {
				t.Fatalf("error %q does not name %q", err, tc.wantKey)
			}
			if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "''") {
				t.Fatalf("error %q should be one line naming the key", err)
			}
		})
	}
}

func TestMissingFileIsAnError(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), nil, nil); err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("want an error naming the file, got %v", err)
	}
}

// FuzzLoad feeds arbitrary bytes to the config file parser: it never panics,
// and a file it accepts gives a Config that passes validation (so the daemon
// never starts on a value it would have refused by name).
func FuzzLoad(f *testing.F) {
	example, err := os.ReadFile("../config.example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(example),
		"listen: 127.0.0.1:9000\nstartWait: 5\nlimits:\n  requestsPerSecond: 0\n",
		"replica:\n  stopGrace: 1.5\n",
		"gpu:\n  simulate:\n    - {name: A100, memoryMiB: 40960}\n",
		"startWait: -1s\n", "bogus: 1\n", "limits: [1, 2]\n", "listen: [\n", "",
	} {
		f.Add([]byte(s))
	}
	path := filepath.Join(f.TempDir(), "config.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(path, nil, nil)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if err := cfg.validate(); err != nil {
			t.Fatalf("Load accepted a config that does not validate: %v", err)
		}
	})
}

// The docs promise that a duration may be a plain number of seconds; that
// holds for INFERD_* variables and flags (strings) as for the file.
func TestPlainSecondsFromEnvironmentAndFlags(t *testing.T) {
	cfg, err := Load("", []string{"INFERD_REPLICA_STOPGRACE=5", "INFERD_STARTWAIT=1.5"}, map[string]string{"resultTTL": "60"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Replica.StopGrace != 5*time.Second || cfg.StartWait != 1500*time.Millisecond || cfg.ResultTTL != time.Minute {
		t.Fatalf("stopGrace %v, startWait %v, resultTTL %v; want 5s, 1.5s, 1m", cfg.Replica.StopGrace, cfg.StartWait, cfg.ResultTTL)
	}
	if _, err := Load("", []string{"INFERD_REPLICA_STOPGRACE=NaN"}, nil); err == nil || !strings.Contains(err.Error(), "stopGrace") {
		t.Fatalf("NaN seconds: err %v, want an error naming replica.stopGrace", err)
	}
}

// gpu.simulate is documented as file only: its variable gets an error that
// says so, not a decoding error about maps and strings.
func TestFileOnlyKeyFromEnvironmentSaysFileOnly(t *testing.T) {
	_, err := Load("", []string{"INFERD_GPU_SIMULATE=[{name: A, memoryMiB: 1}]"}, nil)
	if err == nil || !strings.Contains(err.Error(), "INFERD_GPU_SIMULATE") || !strings.Contains(err.Error(), "only in the config file") {
		t.Fatalf("err %v, want one naming INFERD_GPU_SIMULATE as file only", err)
	}
}

// TestEnsureDataDirClosesAnOpenDataDir: a data dir an admin made 0755
// beforehand is made the daemon's user's only; a new one is made so.
func TestEnsureDataDirClosesAnOpenDataDir(t *testing.T) {
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{open, filepath.Join(t.TempDir(), "new", "data")} {
		if err := (Config{DataDir: dir}).EnsureDataDir(); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("data dir %s after EnsureDataDir: %v, %v; want mode 700", dir, fi.Mode(), err)
		}
	}
}
