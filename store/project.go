package store

import (
	"bytes"
	"encoding/json"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Model protocols.
const (
	ProtocolHTTP      = "http"
	ProtocolPotassium = "potassium"
	// ProtocolOpenAI is an OpenAI-compatible server (vLLM, llama.cpp's
	// server, SGLang, TGI, Ollama): inferd's OpenAI routes address it by
	// model name (docs/openai.md).
	ProtocolOpenAI = "openai"
)

// A replica's network (ModelSpec.Network): a namespace of its own with only
// loopback, or the host's.
const (
	NetworkPrivate = "private"
	NetworkHost    = "host"
)

// Defaults of a new project. The replica bounds and timeouts cannot be
// inferred from a zero value (0 is a valid minReplicas and idleTimeout), so
// they are set only by NewProject; ApplyDefaults fills the model spec.
const (
	DefaultMinReplicas      = 0
	DefaultMaxReplicas      = 3
	DefaultInferenceTimeout = 300 // seconds
	DefaultIdleTimeout      = 30  // seconds
	DefaultConcurrency      = 1
	DefaultBootTimeout      = 600 // seconds
	DefaultInferPath        = "/"
	DefaultHTTPHealthPath   = "/healthz"
	PotassiumHealthPath     = "/__status__"
	// An OpenAI-compatible server: every one of them answers /v1/models,
	// and llama.cpp's answers it 503 while its model loads.
	OpenAIHealthPath = "/v1/models"
	OpenAIInferPath  = "/v1/chat/completions"
)

// Bounds checked by Validate.
const (
	MaxReplicasLimit = 1000
	MaxTimeout       = 86400 // seconds, for inference, idle and boot timeouts
	MaxGPUsPerModel  = 64
	MaxConcurrency   = 1000
	MaxRetries       = 10
	MinMemoryMiB     = 16 // a smaller memoryMiB could not start a model at all
	MaxBatchSize     = 1024
	MaxBatchWaitMs   = 10000 // a longer wait is a queue, not a batch
	MaxAliases       = 32
	MaxModelNameLen  = 256 // an alias or servedModel
	MaxRevisionLen   = 256
)

// NewProject returns a project with every default set: minReplicas 0,
// maxReplicas 3, inferenceTimeout 300 s, idleTimeout 30 s, and the model
// defaults of ModelSpec.WithDefaults. Callers set the model command and key
// hash.
func NewProject(id, teamID string) Project {
	p := Project{
		ID:               id,
		TeamID:           teamID,
		MinReplicas:      DefaultMinReplicas,
		MaxReplicas:      DefaultMaxReplicas,
		InferenceTimeout: DefaultInferenceTimeout,
		IdleTimeout:      DefaultIdleTimeout,
	}
	p.ApplyDefaults()
	return p
}

// ApplyDefaults fills the model spec's zero values (see
// ModelSpec.WithDefaults). It leaves replica bounds and timeouts alone: see
// NewProject.
func (p *Project) ApplyDefaults() { p.Model = p.Model.WithDefaults() }

// WithDefaults returns m with its zero values replaced by the defaults:
// protocol "http", health path "/healthz" ("/__status__" for potassium,
// "/v1/models" for openai), infer path "/" ("/v1/chat/completions" for
// openai), batch path the infer path, concurrency 1 and bootTimeout
// 600 s. It is the only place that knows them.
func (m ModelSpec) WithDefaults() ModelSpec {
	if m.Protocol == "" {
		m.Protocol = ProtocolHTTP
	}
	if m.HealthPath == "" {
		switch m.Protocol {
		case ProtocolPotassium:
			m.HealthPath = PotassiumHealthPath
		case ProtocolOpenAI:
			m.HealthPath = OpenAIHealthPath
		default:
			m.HealthPath = DefaultHTTPHealthPath
		}
	}
	if m.InferPath == "" {
		m.InferPath = DefaultInferPath
		if m.Protocol == ProtocolOpenAI {
			m.InferPath = OpenAIInferPath
		}
	}
	if m.BatchPath == "" {
		m.BatchPath = m.InferPath
	}
	m.Concurrency = m.ConcurrencyOrDefault()
	if m.BootTimeout == 0 {
		m.BootTimeout = DefaultBootTimeout
	}
	return m
}

// ConcurrencyOrDefault is Concurrency as WithDefaults fills it, without
// copying the spec (the scheduler asks on every pass).
func (m *ModelSpec) ConcurrencyOrDefault() int {
	if m.Concurrency == 0 {
		return DefaultConcurrency
	}
	return m.Concurrency
}

// RestartNeeded reports whether replicas started from spec m must be
// replaced (drained) to serve next. It compares the whole spec, defaults
// applied, in its stored encoding, except for the fields that running
// replicas take as they are: the modelKey hash (a key rotation), concurrency
// and batch (how many calls and batches the scheduler hands a replica),
// bootTimeout (how long the scheduler waits for one to start), parkTimeout
// (when it parks an idle one), and the names an OpenAI request may give
// (aliases, servedModel: inferd reads them per request). Any other field, including one
// added later, describes how a replica is started, so a change to it
// restarts them: forgetting a field here can only cost a needless restart,
// never a stale replica.
func (m ModelSpec) RestartNeeded(next ModelSpec) bool {
	a, errA := json.Marshal(m.WithDefaults().launchPart())
	b, errB := json.Marshal(next.WithDefaults().launchPart())
	return errA != nil || errB != nil || !bytes.Equal(a, b)
}

// launchPart is m without the fields that running replicas take as they
// are (see RestartNeeded).
func (m ModelSpec) launchPart() ModelSpec {
	m.KeyHash = ""
	m.Concurrency = 0
	m.Batch = BatchSpec{}
	m.BootTimeout = 0
	m.ParkTimeout = 0
	m.Aliases, m.ServedModel = nil, ""
	return m
}

// GPUDemand is what one replica of a model holds of GPUs: GPUs of them, each
// whole (MemoryMiB 0) or shared, with MemoryMiB of its memory reserved.
type GPUDemand struct {
	GPUs      int   // 0: a CPU replica
	MemoryMiB int64 // per GPU; 0: each GPU whole
}

// GPUDemand reads m's GPU needs: gpus, and gpuMemoryMiB per GPU. A
// gpuMemoryMiB without gpus is a share of one GPU. This is the one rule:
// the scheduler places replicas by it, the cluster leader places projects
// on nodes by it, and quotas, the status, apply and doctor count by it.
func (m ModelSpec) GPUDemand() GPUDemand {
	d := GPUDemand{GPUs: max(m.GPUs, 0), MemoryMiB: int64(max(m.GPUMemoryMiB, 0))}
	if d.GPUs == 0 && d.MemoryMiB > 0 {
		d.GPUs = 1
	}
	return d
}

// Validate checks every field against its bounds and returns the first
// violation as a *ValidationError. It fills no defaults: an empty protocol,
// for one, is invalid (call ApplyDefaults first).
func (p Project) Validate() error {
	switch {
	case !ValidID(p.ID):
		return invalid("id", idRule)
	case !ValidID(p.TeamID):
		return invalid("teamId", idRule)
	case p.MinReplicas < 0:
		return invalid("minReplicas", "must be at least 0")
	case p.MaxReplicas < 1:
		return invalid("maxReplicas", "must be at least 1")
	case p.MaxReplicas > MaxReplicasLimit:
		return invalid("maxReplicas", "must be at most %d", MaxReplicasLimit)
	case p.MinReplicas > p.MaxReplicas:
		return invalid("minReplicas", "must not exceed maxReplicas (%d)", p.MaxReplicas)
	case p.InferenceTimeout < 1 || p.InferenceTimeout > MaxTimeout:
		return invalid("inferenceTimeout", "must be between 1 and %d seconds", MaxTimeout)
	case p.IdleTimeout < 0 || p.IdleTimeout > MaxTimeout:
		return invalid("idleTimeout", "must be between 0 and %d seconds", MaxTimeout)
	case p.Retries < 0 || p.Retries > MaxRetries:
		return invalid("retries", "must be between 0 and %d", MaxRetries)
	case p.Durability != "" && p.Durability != DurabilityStrict && p.Durability != DurabilityAnswered:
		return invalid("durability", "must be %q (the default) or %q", DurabilityStrict, DurabilityAnswered)
	}
	if err := p.Caps.validate(); err != nil {
		return err
	}
	return p.Model.validate()
}

func (m ModelSpec) validate() error {
	switch {
	case len(m.KeyHash) != 64 || !isLowerHex(m.KeyHash):
		return invalid("model.keyHash", "must be 64 lowercase hex characters (a SHA-256)")
	case m.Image == "" && (len(m.Command) == 0 || m.Command[0] == ""):
		return invalid("model.command", "must not be empty (unless the project names an image, whose Entrypoint and Cmd it then runs)")
	case len(m.Command) > 0 && m.Command[0] == "":
		return invalid("model.command", "must not start with an empty program")
	case m.Image != "" && !ValidImageRef(m.Image):
		return invalid("model.image", "must be an image ID (sha256: and at least 12 hex digits) or an absolute path of an image archive")
	case m.Dir != "" && !filepath.IsAbs(m.Dir):
		return invalid("model.dir", "must be an absolute path")
	case m.Protocol != ProtocolHTTP && m.Protocol != ProtocolPotassium && m.Protocol != ProtocolOpenAI:
		return invalid("model.protocol", "must be %q, %q or %q", ProtocolHTTP, ProtocolPotassium, ProtocolOpenAI)
	case m.HealthPath != "" && !strings.HasPrefix(m.HealthPath, "/"):
		return invalid("model.healthPath", "must start with /")
	case m.InferPath != "" && !strings.HasPrefix(m.InferPath, "/"):
		return invalid("model.inferPath", "must start with /")
	case m.GPUs < 0 || m.GPUs > MaxGPUsPerModel:
		return invalid("model.gpus", "must be between 0 and %d", MaxGPUsPerModel)
	case m.GPUMemoryMiB < 0:
		return invalid("model.gpuMemoryMiB", "must be at least 0")
	case m.Concurrency < 1 || m.Concurrency > MaxConcurrency:
		return invalid("model.concurrency", "must be between 1 and %d", MaxConcurrency)
	case m.Protocol == ProtocolPotassium && m.Concurrency != 1:
		// Potassium 0.5 runs every handler on one worker thread: a second call
		// sent to a replica would wait inside the app, its inferenceTimeout
		// already running, while the scheduler counted it as served.
		return invalid("model.concurrency", "must be 1 for protocol %q: a Potassium app runs one call at a time on its single worker (raise maxReplicas to serve more at once)", ProtocolPotassium)
	case m.BootTimeout < 1 || m.BootTimeout > MaxTimeout:
		return invalid("model.bootTimeout", "must be between 1 and %d seconds", MaxTimeout)
	case m.MemoryMiB != 0 && m.MemoryMiB < MinMemoryMiB:
		return invalid("model.memoryMiB", "must be 0 (no limit) or at least %d", MinMemoryMiB)
	case m.PidsMax < 0:
		return invalid("model.pidsMax", "must be 0 (no limit) or more")
	case m.Network != "" && m.Network != NetworkPrivate && m.Network != NetworkHost:
		return invalid("model.network", "must be %q or %q", NetworkPrivate, NetworkHost)
	case m.BatchPath != "" && !strings.HasPrefix(m.BatchPath, "/"):
		return invalid("model.batchPath", "must start with /")
	case m.ParkTimeout < 0 || m.ParkTimeout > MaxTimeout:
		return invalid("model.parkTimeout", "must be between 0 (never park) and %d seconds", MaxTimeout)
	case len(m.Revision) > MaxRevisionLen || strings.ContainsRune(m.Revision, 0):
		return invalid("model.revision", "must be at most %d characters, without NUL", MaxRevisionLen)
	case m.Restarts < 0:
		return invalid("model.restarts", "must be 0 or more")
	}
	if err := m.Batch.validate(m.Protocol); err != nil {
		return err
	}
	if err := m.Python.validate(m.Image); err != nil {
		return err
	}
	if err := m.validateNames(); err != nil {
		return err
	}
	for name, value := range m.Env {
		if name == "" || strings.ContainsAny(name, "=\x00") {
			return invalid("model.env", "variable name %q must be non-empty without = or NUL", name)
		}
		if strings.ContainsRune(value, 0) {
			return invalid("model.env", "value of %s must not contain NUL", name)
		}
	}
	// The kernel cannot take a NUL inside an argument or path: without this
	// check the project would be stored and then fail every boot.
	for _, arg := range m.Command {
		if strings.ContainsRune(arg, 0) {
			return invalid("model.command", "must not contain NUL")
		}
	}
	if strings.ContainsRune(m.Dir, 0) {
		return invalid("model.dir", "must not contain NUL")
	}
	return nil
}

// validate checks a batch setting: off (zero), or maxSize 2 to
// MaxBatchSize with a wait of 0 to MaxBatchWaitMs, for a protocol that can
// take a batch.
func (b BatchSpec) validate(protocol string) error {
	switch {
	case b == BatchSpec{}:
		return nil
	case b.MaxSize < 2 || b.MaxSize > MaxBatchSize:
		return invalid("model.batch.maxSize", "must be between 2 and %d (leave batch out to send one call at a time)", MaxBatchSize)
	case b.MaxWaitMs < 0 || b.MaxWaitMs > MaxBatchWaitMs:
		return invalid("model.batch.maxWaitMs", "must be between 0 and %d", MaxBatchWaitMs)
	case protocol == ProtocolPotassium:
		// A Potassium handler takes one request's JSON and answers it: the
		// framework has no batch endpoint to send {"batch": [...]} to.
		return invalid("model.batch", "protocol %q cannot batch: a Potassium handler answers one call per request (use protocol http with a batchPath, or leave batch out)", ProtocolPotassium)
	case protocol == ProtocolOpenAI:
		// An OpenAI-compatible server batches on its own (vLLM's
		// continuous batching): raise concurrency instead.
		return invalid("model.batch", "protocol %q cannot batch: an OpenAI-compatible server takes one request per call and batches them itself (raise concurrency instead)", ProtocolOpenAI)
	}
	return nil
}

// validate checks a Python environment: a requirements file, absolute
// paths, and no image (which brings its own Python).
func (p PythonSpec) validate(image string) error {
	switch {
	case !p.On():
		return nil
	case image != "":
		return invalid("model.python", "cannot go with an image: an image brings its own Python (install the packages into the image)")
	case p.Requirements == "":
		return invalid("model.python.requirements", "is required: the requirements file the environment is built from")
	}
	for _, f := range []struct{ name, path string }{
		{"model.python.requirements", p.Requirements}, {"model.python.wheelhouse", p.Wheelhouse}, {"model.python.interpreter", p.Interpreter},
	} {
		if f.path != "" && (!filepath.IsAbs(f.path) || strings.ContainsRune(f.path, 0)) {
			return invalid(f.name, "must be an absolute path")
		}
	}
	return nil
}

// ValidImageRef reports whether ref can name an image: an image ID
// ("sha256:" and 12 to 64 lowercase hex digits) or an absolute path.
func ValidImageRef(ref string) bool {
	if hex, ok := strings.CutPrefix(ref, "sha256:"); ok {
		return len(hex) >= 12 && len(hex) <= 64 && isLowerHex(hex)
	}
	return filepath.IsAbs(ref) && !strings.ContainsRune(ref, 0)
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Clone returns p with its own slices and maps, so that changing the copy
// never changes p (stores hand out clones of what they keep).
func (p Project) Clone() Project {
	p.Model.Command = slices.Clone(p.Model.Command)
	p.Model.Env = maps.Clone(p.Model.Env)
	p.Model.Aliases = slices.Clone(p.Model.Aliases)
	if p.LastApplied != nil {
		last := p.LastApplied.Clone()
		p.LastApplied = &last
	}
	return p
}

// SameContent reports whether a and b have the same content, ignoring the
// Created and Updated stamps: a write of b over a changes nothing. It
// compares the JSON encodings, the stored form (map keys are sorted, so the
// encoding is deterministic).
func SameContent(a, b Project) bool {
	a.Created, a.Updated = time.Time{}, time.Time{}
	b.Created, b.Updated = time.Time{}, time.Time{}
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// Edit is the part of every UpdateProject that does not depend on the
// storage: it runs fn on a clone of old and validates the result. An error
// from fn, a changed id or an invalid result is returned as is.
func Edit(old Project, fn func(*Project) error) (Project, error) {
	p := old.Clone()
	if err := fn(&p); err != nil {
		return Project{}, err
	}
	if p.ID != old.ID {
		return Project{}, invalid("id", "cannot be changed")
	}
	if err := p.Validate(); err != nil {
		return Project{}, err
	}
	return p, nil
}

// DurabilityStrict and DurabilityAnswered are Project.Durability's values:
// a plain sync start answered once its record is durable (the default), or
// as soon as its result is known.
const (
	DurabilityStrict   = "strict"
	DurabilityAnswered = "answered"
)

// AnswersFirst reports whether p's plain sync starts are answered before
// their record is durable (durability: answered).
func (p Project) AnswersFirst() bool { return p.Durability == DurabilityAnswered }
