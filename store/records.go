package store

import (
	"encoding/json"
	"time"
)

// Team owns projects and API keys.
type Team struct {
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
	Quota   Quota     `json:"quota,omitzero"` // set by an admin; zero = unlimited
}

// KeyScope says what an API key may reach.
type KeyScope string

// Key scopes: a team key sees its own team's projects and calls, within its
// KeyLimits; an admin key sees every team's and may use admin endpoints.
const (
	ScopeTeam  KeyScope = "team"
	ScopeAdmin KeyScope = "admin"
)

// APIKey is the stored half of an API key. The secret itself is shown once at
// creation and never stored: only its SHA-256 (hex) is kept, found through the
// non-secret ID that the secret embeds.
type APIKey struct {
	ID      string    `json:"id"`
	TeamID  string    `json:"teamId"`
	Scope   KeyScope  `json:"scope"`
	Hash    string    `json:"hash"`
	Created time.Time `json:"created"`
	Revoked time.Time `json:"revoked,omitzero"`
	// KeyLimits narrow a team key: permissions, expiry, project allowlist.
	// Zero (a key made before they existed) is today's reach.
	KeyLimits
}

// IsRevoked reports whether the key has been revoked.
func (k APIKey) IsRevoked() bool { return !k.Revoked.IsZero() }

// Project is a deployment: the six fields of the project API plus the model
// spec, which the API never exposes.
type Project struct {
	ID               string `json:"id"`
	TeamID           string `json:"teamId"`
	MinReplicas      int    `json:"minReplicas"`
	MaxReplicas      int    `json:"maxReplicas"`
	InferenceTimeout int    `json:"inferenceTimeout"` // seconds
	IdleTimeout      int    `json:"idleTimeout"`      // seconds
	// Retries is how many times a call interrupted by a restart or a model
	// crash is run again under the same callID (0: never). Model errors and
	// timeouts are never retried.
	Retries int `json:"retries,omitempty"`
	// Durability says when a plain sync start of the project (no
	// startOnly, idempotency key or webhook, finished within startWait)
	// is answered: DurabilityStrict ("" reads as it) once its record is
	// durable, DurabilityAnswered as soon as its result is known, its
	// record group-committed just after (docs/reliability.md).
	Durability string    `json:"durability,omitempty"`
	Model      ModelSpec `json:"model"`
	// Caps bound what the team may set through the project API; only an
	// admin (the manifest) sets them.
	Caps ProjectCaps `json:"caps,omitzero"`
	// LastApplied is the project as a manifest last declared it (see
	// Declared and Reapply): a re-apply changes only what the manifest
	// changed since. Nil for a project no apply wrote since inferd kept it.
	LastApplied *Project  `json:"lastApplied,omitempty"`
	Created     time.Time `json:"created"`
	Updated     time.Time `json:"updated"`
}

// ModelSpec says how to start and talk to a project's model server. It is
// the one description of a model: the store keeps it (as JSON), the manifest
// is written in it (as YAML, inline in a project entry), the admin API shows
// it and the replica backend starts processes from it, so a new field is
// added here and nowhere else. Defaults come from WithDefaults; whether
// running replicas must be replaced after a change is RestartNeeded.
type ModelSpec struct {
	// KeyHash is the hex SHA-256 of the modelKey. The manifest gives the
	// modelKey itself, never this; the admin API leaves it out.
	KeyHash      string            `json:"keyHash,omitempty" yaml:"-"`
	Command      []string          `json:"command" yaml:"command"`
	Dir          string            `json:"dir,omitempty" yaml:"dir"` // absolute working directory
	Env          map[string]string `json:"env,omitempty" yaml:"env"`
	Protocol     string            `json:"protocol" yaml:"protocol"` // "http", "potassium" or "openai"
	HealthPath   string            `json:"healthPath,omitempty" yaml:"healthPath"`
	InferPath    string            `json:"inferPath,omitempty" yaml:"inferPath"`
	GPUs         int               `json:"gpus" yaml:"gpus"` // whole GPUs per replica; 0 = CPU
	GPUMemoryMiB int               `json:"gpuMemoryMiB,omitempty" yaml:"gpuMemoryMiB"`
	Concurrency  int               `json:"concurrency" yaml:"concurrency"`       // calls at once per replica
	BootTimeout  int               `json:"bootTimeout" yaml:"bootTimeout"`       // seconds
	MemoryMiB    int               `json:"memoryMiB,omitempty" yaml:"memoryMiB"` // memory of a replica's whole process tree; 0 = no limit
	PidsMax      int               `json:"pidsMax,omitempty" yaml:"pidsMax"`     // processes and threads of a replica; 0 = no limit
	Network      string            `json:"network,omitempty" yaml:"network"`     // NetworkPrivate, NetworkHost, or "" = the daemon's replica.network
	// ParkTimeout parks a GPU replica idle this many seconds (0: never):
	// its GPU memory goes to host memory through the CUDA driver's
	// checkpoint API, its process is frozen and its GPUs are free for
	// others until a call restores it; see docs/gpu.md "Parking".
	ParkTimeout int `json:"parkTimeout,omitempty" yaml:"parkTimeout"`
	// Batch turns on dynamic batching (zero: off): the scheduler hands a
	// replica up to Batch.MaxSize queued calls in one request to BatchPath
	// (default InferPath); see docs/protocols.md "Batches".
	Batch     BatchSpec `json:"batch,omitzero" yaml:"batch"`
	BatchPath string    `json:"batchPath,omitempty" yaml:"batchPath"`
	// AllowUserNamespaces lets the project's models make user namespaces,
	// which the replica sandbox refuses them by default (a seccomp filter:
	// docs/security.md).
	AllowUserNamespaces bool `json:"allowUserNamespaces,omitempty" yaml:"allowUserNamespaces"`
	// Aliases are more names than the project id by which an OpenAI
	// request's "model" may ask for this project (protocol openai; see
	// ResolveModel).
	Aliases []string `json:"aliases,omitempty" yaml:"aliases"`
	// ServedModel is the model name the server itself knows (vLLM's
	// --served-model-name), put in the "model" of each request inferd
	// passes on; "" = the project id.
	ServedModel string `json:"servedModel,omitempty" yaml:"servedModel"`
	// Revision names the version of the model's code: the manifest's
	// revision, or where it gives none the hash of the model's dir that
	// apply takes (manifest.StampRevisions). Like any field that says how
	// replicas start, a new one replaces the running replicas, one by one
	// (scheduler/rollout.go).
	Revision string `json:"revision,omitempty" yaml:"revision"`
	// Restarts counts the restarts asked for (`inferd project restart`):
	// each replaces the running replicas one by one. No manifest sets it,
	// and an apply keeps it (store.Reapply: the declaration never has it).
	Restarts int `json:"restarts,omitempty" yaml:"-"`
	// Image is the OCI image the model runs in (docs/images.md): an
	// imported image's ID ("sha256:" and at least 12 hex digits), or the
	// absolute path of an image archive or layout, which apply imports
	// and replaces with its ID. The image's Entrypoint and Cmd are the
	// default of Command, its WorkingDir of Dir, and its Env comes first
	// in the model's environment.
	Image string `json:"image,omitempty" yaml:"image"`
	// Python gives the model a Python virtual environment of its own,
	// built from its requirements (docs/python.md); the zero value: none.
	Python PythonSpec `json:"python,omitzero" yaml:"python"`
}

// PythonSpec is a project's Python environment: its requirements file,
// the wheelhouse it is built from offline ("" = the configured package
// index) and the interpreter it is made of ("" = /usr/bin/python3). Paths
// are absolute (the manifest makes them so). Projects that ask for the
// same environment share one.
type PythonSpec struct {
	Requirements string `json:"requirements,omitempty" yaml:"requirements"`
	Wheelhouse   string `json:"wheelhouse,omitempty" yaml:"wheelhouse"`
	Interpreter  string `json:"interpreter,omitempty" yaml:"interpreter"`
}

// On reports whether the project asks for an environment.
func (p PythonSpec) On() bool { return p != PythonSpec{} }

// BatchSpec is a project's dynamic batching: up to MaxSize queued calls in
// one request to the model, waiting at most MaxWaitMs from the first one's
// arrival for more. The zero value is off.
type BatchSpec struct {
	MaxSize   int `json:"maxSize,omitempty" yaml:"maxSize"`
	MaxWaitMs int `json:"maxWaitMs,omitempty" yaml:"maxWaitMs"`
}

// On reports whether batching is on: more than one call per request.
func (b BatchSpec) On() bool { return b.MaxSize > 1 }

// CallState is where an inference call is in its life.
type CallState string

// Call states. Booting is never stored: the scheduler reports it for a queued
// call whose replica is starting.
const (
	CallQueued    CallState = "queued"
	CallBooting   CallState = "booting"
	CallRunning   CallState = "running"
	CallSucceeded CallState = "succeeded"
	CallFailed    CallState = "failed"
)

// Done reports whether the state is final.
func (s CallState) Done() bool { return s == CallSucceeded || s == CallFailed }

// SmallPayload is the size up to which a call's inputs or outputs are small:
// a store keeps them in the call's record (no larger than its metadata, they
// are not worth a read of their own), and the scheduler keeps a queued
// call's small inputs in memory. Larger ones are read only where needed.
const SmallPayload = 4 << 10

// Call is one inference call, from admission to its result.
//
// Its payloads, Inputs and Outputs, are raw JSON kept apart from the rest in
// the store (see Calls): a queued call's inputs are read when it is
// dispatched, and a check reads the outputs as bytes, never decoding them.
type Call struct {
	ID        string          `json:"id"` // "call_" + UUIDv7
	ProjectID string          `json:"projectId"`
	TeamID    string          `json:"teamId"`
	State     CallState       `json:"state"`
	Inputs    json.RawMessage `json:"inputs,omitempty"`
	Outputs   json.RawMessage `json:"outputs,omitempty"` // the model's JSON reply
	Message   string          `json:"message,omitempty"` // "success" or "error: ..." once done
	// Failure is how a failed call ended, for the answers that say it in
	// a status of their own (FailureOf reads it); nil while it has not.
	Failure    *Failure  `json:"failure,omitempty"`
	Attempt    int       `json:"attempt"`
	ReplicaID  string    `json:"replicaId,omitempty"`
	Created    time.Time `json:"created"`
	Dispatched time.Time `json:"dispatched,omitzero"`
	Finished   time.Time `json:"finished,omitzero"`
	QueueMs    int64     `json:"queueMs,omitempty"`
	BootMs     int64     `json:"bootMs,omitempty"`
	RunMs      int64     `json:"runMs,omitempty"`
	// BatchSize is how many calls the request that ran this one carried
	// (0: not batched: the project does not batch), and BatchWaitMs how
	// much of QueueMs it waited for that batch to fill (see the
	// scheduler's batch.go).
	BatchSize   int   `json:"batchSize,omitempty"`
	BatchWaitMs int64 `json:"batchWaitMs,omitempty"`
	// InputBytes is the size of the stored inputs, filled in by the reads
	// that leave the inputs out (PendingCalls, GetCallResult); never stored.
	InputBytes int64 `json:"-"`

	// What the start asked for besides the inputs (all optional). Timeout
	// and QueueTimeout are seconds; Timeout only ever lowers the project's
	// inferenceTimeout, QueueTimeout counts from Created.
	Priority     Priority `json:"priority,omitempty"`
	Timeout      int      `json:"timeout,omitempty"`
	QueueTimeout int      `json:"queueTimeout,omitempty"`
	// IdempotencyKey, unique per team while the call is kept, makes a
	// repeated start return this call (see Calls.CallByIdempotencyKey);
	// RequestHash tells a repeat from a different request under the same
	// key (see RequestHash).
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	RequestHash    string `json:"requestHash,omitempty"`

	// Route is the model route the call goes to (the Banana Client's
	// POST /run/PROJECT/ROUTE); "" is the project's own inferPath.
	Route string `json:"route,omitempty"`
	// Streamed says the model streamed its reply: Outputs is the JSON
	// array of its lines, which is modelOutputs as it is.
	Streamed bool `json:"streamed,omitempty"`
	// Webhook is the URL the call's webhook events go to, and
	// WebhookEvents which (none: completed only); see DeliveriesFor.
	Webhook       string   `json:"webhook,omitempty"`
	WebhookEvents []string `json:"webhookEvents,omitempty"`
	// Tokens is what an OpenAI-compatible model reported the call used
	// (protocol openai), set with its result; nil when it reported none.
	Tokens *Tokens `json:"tokens,omitempty"`

	// Usage is what the call used (the usage ledger's entry), set on its
	// final write; nil before, and for calls finished before inferd kept
	// it.
	Usage *CallUsage `json:"usage,omitempty"`

	// QueuePosition is how many calls will be dispatched before this one
	// (0 = next), for a queued call the scheduler reports; never stored.
	QueuePosition int `json:"-"`
	// WaitingFor says why a queued call waits, for a call the scheduler
	// reports (its message stays the state name); never stored.
	WaitingFor *Wait `json:"-"`
	// ETAMs estimates how long until the call has finished, for a queued
	// call the scheduler reports; nil when it cannot tell (nothing
	// measured yet, or waiting on something it cannot time); never stored.
	ETAMs *int64 `json:"-"`
	// ETARangeMs is how rough ETAMs is: the same estimate from the
	// project's 10th and 90th percentile recent runs (lower, upper); set
	// with ETAMs, never stored.
	ETARangeMs *[2]int64 `json:"-"`
}

// Wait is why a pending call waits: a code for programs and a sentence for
// people, e.g. {"replicasBusy", "all 2 replicas busy (next free in ~0.8 s)"}.
// The codes are the scheduler's (scheduler.Wait*).
//
// Text never names another project. Where the sentence is clearer with
// names (which projects' minReplicas hold the CPU slot or GPU the call
// needs), Named says it with them and Names lists them: an API shows
// Named only to a caller that may see every project in Names (Shown), so
// that no team learns another team's project names (DESIGN.md: another
// team's project is never revealed to exist).
type Wait struct {
	Code  string       `json:"code"`
	Text  string       `json:"text"`
	Named string       `json:"-"`
	Names []ProjectRef `json:"-"`
}

// ProjectRef names a project and its team.
type ProjectRef struct {
	TeamID, ID string
}

// Shown is w as a caller sees it who may see the projects for which
// reaches is true: Named when it may see every one of Names, else Text;
// the copy carries no names beyond its text. nil stays nil.
func (w *Wait) Shown(reaches func(teamID, projectID string) bool) *Wait {
	if w == nil {
		return nil
	}
	out := &Wait{Code: w.Code, Text: w.Text}
	if w.Named == "" {
		return out
	}
	for _, n := range w.Names {
		if !reaches(n.TeamID, n.ID) {
			return out
		}
	}
	out.Text = w.Named
	return out
}

// Priority orders the queued calls of one project: high before normal
// before low, with aging (see the scheduler).
type Priority string

// Call priorities; "" reads as PriorityNormal.
const (
	PriorityHigh   Priority = "high"
	PriorityNormal Priority = "normal"
	PriorityLow    Priority = "low"
)

// ParsePriority returns the priority named s ("" is normal), or false.
func ParsePriority(s string) (Priority, bool) {
	switch Priority(s) {
	case "", PriorityNormal:
		return PriorityNormal, true
	case PriorityHigh, PriorityLow:
		return Priority(s), true
	}
	return "", false
}

// Change says what a project write did.
type Change string

// Outcomes of PutProject.
const (
	ChangeCreated   Change = "created"
	ChangeUpdated   Change = "updated"
	ChangeUnchanged Change = "unchanged"
)

// CommitStats counts a store's group commits of call records since it was
// opened, for metrics.
type CommitStats struct {
	Commits  int64         // write transactions committed (or failed)
	Writes   int64         // call writes in them
	Duration time.Duration // total time spent in them, fsyncs included
}

// OpStats counts what a store backed by a consensus service (cluster mode's
// etcd) has asked of it since it was opened, for metrics: requests (each one
// round to the cluster) and the reads and writes they carried out. A write is
// applied and made durable by every member.
type OpStats struct {
	Requests, Reads, Writes int64
}
