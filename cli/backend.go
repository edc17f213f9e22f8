package cli

import (
	"inferd/config"
	"inferd/scheduler/backend/local"
)

// BackendConfig is how the local-process backend runs replicas under cfg:
// its logs, pid files, sandbox, stop grace, and what it places them on. serve
// runs replicas with it, and doctor checks the sandbox it gives.
func BackendConfig(cfg config.Config, gpus local.Inventory) local.Config {
	r := cfg.Replica
	first, last, _ := config.ParseUIDRange(r.UIDRange) // Load validated it
	return local.Config{
		LogDir:                cfg.LogDir(),
		LogMaxBytes:           r.LogMaxBytes,
		LogKeep:               r.LogKeep,
		LogMaxBytesPerProject: r.LogMaxBytesPerProject,
		RunDir:                cfg.RunDir(),
		User:                  r.User, // config.PerProjectUser is local.PerProject
		UIDFirst:              first,
		UIDLast:               last,
		UIDFile:               cfg.UIDFile(),
		Network:               r.Network,
		NoCgroups:             !r.Cgroups,
		StopGrace:             r.StopGrace,
		CPUSlots:              cfg.CPUSlots, // 0 = one per CPU
		GPUs:                  gpus,
		DevDir:                cfg.GPU.DevDir,
		PassEnv:               r.PassEnv,
		ImageDir:              cfg.ImageDir(),
		PythonDir:             cfg.PythonDir(),
		PythonIndex:           cfg.Python.Index,
	}
}
