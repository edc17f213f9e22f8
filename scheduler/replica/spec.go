package replica

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"inferd/store"
)

// Defaults applied by Start to the zero values of a Spec's own fields; the
// model spec's come from store.ModelSpec.WithDefaults.
const (
	DefaultLogMaxBytes = 10 << 20
	DefaultLogKeep     = 3
)

// Spec describes one model server process to start: the project's model
// spec as stored, and where this replica runs it.
type Spec struct {
	ID, ProjectID string // replica and project ids; ID is unique per RunDir and names the pid file (no "/")
	// ModelSpec is the project's model spec. Start uses Command (argv; a
	// relative program path is taken relative to Dir), Dir ("" = the
	// daemon's), Env (added on top of the allowlisted base), Protocol,
	// HealthPath (readiness, GET) and InferPath (inference, POST); the
	// scheduler has already placed GPUs and GPUMemoryMiB as GPUUUIDs.
	store.ModelSpec
	GPUUUIDs    []string // GPUs the model may see; empty = CPU only
	LogPath     string   // stdout+stderr; parent dirs created; "" = not kept
	LogMaxBytes int64    // rotate to LogPath+".1" beyond this; default 10 MiB
	LogKeep     int      // old generations kept (LogPath+".1" .. ".N"); default 3
	RunDir      string   // holds <ID>.pid while the process runs; "" = no pid file
	RunAs       *RunAs   // the user the process runs as; nil = inferd's own
}

// baseEnvKeys are the only variables copied from the daemon's environment. pyenv's
// are included because python3 is commonly a pyenv shim that needs them.
var baseEnvKeys = []string{
	"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
	"PYENV_ROOT", "PYENV_VERSION",
}

// withDefaults returns spec with zero values replaced by defaults, or an error when
// the spec cannot be started.
func (s Spec) withDefaults() (Spec, error) {
	s.ModelSpec = s.ModelSpec.WithDefaults()
	if s.LogMaxBytes <= 0 {
		s.LogMaxBytes = DefaultLogMaxBytes
	}
	if s.LogKeep <= 0 {
		s.LogKeep = DefaultLogKeep
	}
	switch {
	case s.ID == "" || s.ID == "." || s.ID == ".." || strings.ContainsAny(s.ID, "/\x00"):
		return s, fmt.Errorf("invalid replica id %q", s.ID)
	case len(s.Command) == 0 || s.Command[0] == "":
		return s, errors.New("empty command")
	case s.Protocol != store.ProtocolHTTP && s.Protocol != ProtocolPotassium:
		return s, fmt.Errorf("unsupported protocol %q (supported: %q, %q)", s.Protocol, store.ProtocolHTTP, ProtocolPotassium)
	case !strings.HasPrefix(s.HealthPath, "/"):
		return s, fmt.Errorf("health path %q does not start with /", s.HealthPath)
	case !strings.HasPrefix(s.InferPath, "/"):
		return s, fmt.Errorf("infer path %q does not start with /", s.InferPath)
	}
	for k := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return s, fmt.Errorf("invalid env name %q", k)
		}
	}
	return s, nil
}

// environ builds the model's environment: the allowlisted base read through getenv,
// then the project's env, then the variables inferd owns, which the project cannot
// override. The result is sorted, one NAME=value per variable.
func (s Spec) environ(port int, getenv func(string) (string, bool)) []string {
	env := map[string]string{}
	for _, k := range baseEnvKeys {
		if v, ok := getenv(k); ok {
			env[k] = v
		}
	}
	// Unbuffered Python output makes the log (and LastLogLine) current; a project may
	// still turn it off.
	env["PYTHONUNBUFFERED"] = "1"
	for k, v := range s.Env {
		env[k] = v
	}
	gpus := strings.Join(s.GPUUUIDs, ",")
	nvidia := gpus
	if nvidia == "" {
		// For the NVIDIA container runtime "" would mean "all GPUs"; "void" means none.
		nvidia = "void"
	}
	if s.RunAs != nil {
		env["HOME"], env["USER"], env["LOGNAME"] = s.RunAs.Home, s.RunAs.Name, s.RunAs.Name
	}
	// HOST tells the model where to listen: inferd reaches it on loopback, and
	// nothing else on the network should.
	env["HOST"] = "127.0.0.1"
	env["PORT"] = fmt.Sprint(port)
	env["CUDA_VISIBLE_DEVICES"] = gpus
	env["NVIDIA_VISIBLE_DEVICES"] = nvidia
	env["INFERD_PROJECT_ID"] = s.ProjectID
	env["INFERD_REPLICA_ID"] = s.ID

	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
