package local

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"inferd/scheduler/backend"
)

// baseEnvKeys are the only variables copied from the daemon's environment. pyenv's
// are included because python3 is commonly a pyenv shim that needs them.
var baseEnvKeys = []string{
	"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
	"PYENV_ROOT", "PYENV_VERSION",
}

// checkSpec returns an error when spec cannot be started as a process. The
// model protocol's fields are checked by protocol.New.
func (b *Backend) checkSpec(s backend.Spec) error {
	switch {
	case !pathName(s.ReplicaID):
		return fmt.Errorf("invalid replica id %q", s.ReplicaID)
	case b.cfg.LogDir != "" && !pathName(s.ProjectID):
		return fmt.Errorf("invalid project id %q", s.ProjectID)
	case b.cfg.LogDir != "" && !pathName(s.TeamID):
		return fmt.Errorf("invalid team id %q", s.TeamID)
	case s.Model.Image == "" && (len(s.Model.Command) == 0 || s.Model.Command[0] == ""):
		return errors.New("empty command")
	}
	for k := range s.Model.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("invalid env name %q", k)
		}
	}
	return nil
}

// pathName reports whether s can name a file or directory of its own: the
// replica id names its pid file and its log, the team and project ids the
// directories its log is kept in.
func pathName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00")
}

// environ builds the model's environment: the allowlisted base and the names in
// pass (replica.passEnv) read through getenv, HOME and TMPDIR in the replica's
// private directory dir, then the project's env (env, which may differ from the
// spec's: see preparePotassium; it may move HOME or TMPDIR elsewhere), then the
// variables inferd owns, which the project cannot override. The result is
// sorted, one NAME=value per variable.
func environ(s backend.Spec, env map[string]string, port int, runAs *RunAs, dir string, pass []string, getenv func(string) (string, bool)) []string {
	vars := map[string]string{}
	for _, k := range slices.Concat(baseEnvKeys, pass) {
		if v, ok := getenv(k); ok {
			vars[k] = v
		}
	}
	if runAs != nil {
		vars["USER"], vars["LOGNAME"] = runAs.Name, runAs.Name
	}
	if dir != "" {
		vars["HOME"], vars["TMPDIR"] = dir, dir
	}
	// Unbuffered Python output makes the log (and LastLogLine) current; a project may
	// still turn it off.
	vars["PYTHONUNBUFFERED"] = "1"
	for k, v := range env {
		vars[k] = v
	}
	gpus := strings.Join(s.GPUs, ",")
	nvidia := gpus
	if nvidia == "" {
		// For the NVIDIA container runtime "" would mean "all GPUs"; "void" means none.
		nvidia = "void"
	}
	// HOST tells the model where to listen: inferd reaches it on loopback, and
	// nothing else on the network should.
	vars["HOST"] = "127.0.0.1"
	vars["PORT"] = fmt.Sprint(port)
	vars["CUDA_VISIBLE_DEVICES"] = gpus
	vars["NVIDIA_VISIBLE_DEVICES"] = nvidia
	vars["INFERD_PROJECT_ID"] = s.ProjectID
	vars["INFERD_REPLICA_ID"] = s.ReplicaID

	out := make([]string, 0, len(vars))
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// ModelEnv is the environment a replica of s would get, with home as its
// HOME and TMPDIR and no port of its own: for checks that run the model's
// own program outside a replica (doctor asking its Python about CUDA).
func ModelEnv(s backend.Spec, runAs *RunAs, home string, pass []string) []string {
	return environ(s, s.Model.Env, 0, runAs, home, pass, os.LookupEnv)
}
