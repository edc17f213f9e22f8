package backend

// Protection is one way replicas are kept apart from each other and from
// the daemon, and whether it is in force: a backend runs with what the
// machine and its privileges allow, and says which protections that leaves
// (at start-up, in doctor and in /v1/status).
type Protection struct {
	// Name is one of the Protection* names.
	Name string `json:"name"`
	// On says whether it is in force for replicas started from now on.
	On bool `json:"on"`
	// Detail says how it is in force, or why it is not and what would
	// turn it on.
	Detail string `json:"detail"`
}

// The protections a backend reports, in this order.
const (
	// ProtectionIdentity: each project's models run under a user of their
	// own, so none can read or signal another's processes.
	ProtectionIdentity = "identity"
	// ProtectionProcessTree: stopping a replica ends everything it
	// started, a child that left its process group included.
	ProtectionProcessTree = "processTree"
	// ProtectionMemoryLimit: a project's memoryMiB is enforced.
	ProtectionMemoryLimit = "memoryLimit"
	// ProtectionPidsLimit: a project's pidsMax is enforced.
	ProtectionPidsLimit = "pidsLimit"
	// ProtectionNetwork: each replica has a network of its own, reaching
	// neither other models, the daemon's API nor the outside.
	ProtectionNetwork = "network"
	// ProtectionPrivateDirs: HOME and TMPDIR are a directory of the
	// replica's own, removed when it ends.
	ProtectionPrivateDirs = "privateDirs"
	// ProtectionDevices: a replica may open only its own GPUs' device
	// nodes, not the other GPUs of the box.
	ProtectionDevices = "devices"
	// ProtectionPIDNamespace: each replica has a PID namespace of its own
	// with its own /proc (no model sees another's processes or inferd's),
	// which ends whole when the daemon dies, even by kill -9.
	ProtectionPIDNamespace = "pidNamespace"
	// ProtectionPrivateTmp: /tmp, /var/tmp and /dev/shm are the replica's
	// own, within its memoryMiB, and go with it.
	ProtectionPrivateTmp = "privateTmp"
	// ProtectionUserNamespaces: models may not make user namespaces
	// unless their project allows it.
	ProtectionUserNamespaces = "userNamespaces"
	// ProtectionPrivateFiles: the logs and other files a model must not
	// read are closed to other users, whatever the data dir's mode.
	ProtectionPrivateFiles = "privateFiles"
)
