package status

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/rs/zerolog"

	"inferd/gpu"
	"inferd/httpapi/respond"
	"inferd/httpapi/usage"
	"inferd/image"
	"inferd/pipeline"
	"inferd/scheduler"
	"inferd/scheduler/backend"
	"inferd/store"
	"inferd/webhook"
)

// Bounds of the status endpoints.
const (
	defaultStatusCalls = 50               // recent calls shown
	maxStatusCalls     = 500              // ?limit= cap
	latencyWindow      = 500              // newest calls of the caller's teams that p50/p95 are taken over
	failureWindow      = 15 * time.Minute // a failure this recent puts its project first on the page
	defaultLogLines    = 200              // log lines shown
	maxLogLines        = 5000             // ?lines= cap
	maxStatusMessage   = 300              // a failed call's message is cut here
)

// Sources feed the /v1/status endpoints and the status page. Any
// function may be nil (nothing of that kind is shown).
type Sources struct {
	Snapshot func() scheduler.Status // the scheduler's Snapshot
	GPUs     func() []gpu.Device     // the GPU inventory's Devices
	Calls    RecentCalls
	Logs     backend.Logs     // replica logs; nil = none
	Now      func() time.Time // for uptimes; nil = time.Now
	History  History          // the charts' samples (/v1/status/history); nil = none
	// Webhooks counts webhook messages of a team ("" = all teams): the
	// webhook deliverer's Stats.
	Webhooks func(teamID string) webhook.Stats
	// Protections says how replicas are contained (the backend's sandbox).
	Protections func() []backend.Protection
	// Images says what the images projects run in take on this node's
	// disk (docs/images.md).
	Images func() (image.Usage, error)
}

// RecentCalls is what the status endpoints read of a store.Store.
type RecentCalls interface {
	// RecentCalls returns up to limit calls of teamID ("" = all), newest
	// first, without inputs and outputs.
	RecentCalls(teamID string, limit int) ([]store.Call, error)
}

// Store is what the status endpoints read of the store.
type Store interface {
	ListProjects(teamID string) ([]store.Project, error)
	GetProject(id string) (store.Project, error)
	usage.Reader // the usage panel
}

// Config is what the status API is made of.
type Config struct {
	Sources Sources
	Store   Store
	// Key authenticates a request's key, as the project API does (the
	// same header; the public API's, which refuses a key that may not
	// read).
	Key func(r *http.Request) (store.APIKey, error)
	// Cluster, in cluster mode, is this node's view of the cluster (the
	// cluster section); nil on a single box.
	Cluster ClusterView
	Log     zerolog.Logger
}

// Handlers are the status API's endpoints, which the public API's route
// table serves: each but Page and Assets under a key that may read.
// Cluster is nil without a cluster view, History without a recorder.
type Handlers struct {
	All, GPUs, Projects, Calls, Usage, Logs, Cluster, History httprouter.Handle
	Page, Assets                                              httprouter.Handle
}

// New returns the handlers of the status API of cfg.
func New(cfg Config) Handlers {
	s := &api{src: cfg.Sources, store: cfg.Store, key: cfg.Key, clusterView: cfg.Cluster, log: cfg.Log}
	h := Handlers{All: s.all, GPUs: list(s, false, s.gpus), Projects: list(s, true, s.projects),
		Calls: list(s, true, s.calls), Usage: s.usage, Logs: s.logs}
	if cfg.Cluster != nil {
		h.Cluster = s.cluster
	}
	if cfg.Sources.History != nil {
		h.History = s.history
	}
	h.Page, h.Assets = pageHandlers()
	return h
}

// api serves /v1/status. Every endpoint needs an API key in the same
// header as the project API: a team key sees its own projects, calls and
// logs, an admin key everyone's; another team's project is a 404. It never
// shows call inputs or outputs.
type api struct {
	src         Sources
	store       Store
	key         func(r *http.Request) (store.APIKey, error)
	clusterView ClusterView
	log         zerolog.Logger
}

func (s *api) now() time.Time {
	if s.src.Now != nil {
		return s.src.Now()
	}
	return time.Now()
}

// GPU is one GPU or MIG device; HeldBy names the replica holding it
// when the caller may see that replica's project, and Held says whether
// anyone does. MemoryUsedBytes is the driver's view (for a simulated GPU,
// the reservation); MemoryReservedBytes is what inferd has handed out on it,
// which moves at once when a replica starts or stops. Healthy is false
// while the device gets no replicas (lost, unreadable); Problem says why.
type GPU struct {
	Index               int          `json:"index"`
	UUID                string       `json:"uuid"`
	Name                string       `json:"name"`
	MemoryTotalBytes    uint64       `json:"memoryTotalBytes"`
	MemoryUsedBytes     uint64       `json:"memoryUsedBytes"`
	MemoryReservedBytes uint64       `json:"memoryReservedBytes"`
	UtilizationPct      int          `json:"utilizationPct"` // 0 for simulated GPUs
	Simulated           bool         `json:"simulated"`
	Healthy             bool         `json:"healthy"`
	Problem             string       `json:"problem,omitempty"`
	MIG                 bool         `json:"mig"`              // a MIG device, pinned as MIG-<uuid>
	Parent              string       `json:"parent,omitempty"` // a MIG device's GPU
	Held                bool         `json:"held"`
	HeldBy              *ReplicaName `json:"heldBy"`
}

type ReplicaName struct {
	Project string `json:"project"`
	Replica string `json:"replica"`
}

// Project is one project: its bounds, queue, replicas and latency.
type Project struct {
	ID          string    `json:"id"`
	TeamID      string    `json:"teamId"`
	MinReplicas int       `json:"minReplicas"`
	MaxReplicas int       `json:"maxReplicas"`
	GPUs        int       `json:"gpusPerReplica"`
	Durability  string    `json:"durability"` // "strict" or "answered" (store.Project.Durability)
	Queued      int       `json:"queued"`
	Running     int       `json:"running"`
	Waiting     string    `json:"waiting"`
	LastError   string    `json:"lastError"`
	OOMKills    int       `json:"oomKills"`     // replicas killed for going over memoryMiB since the daemon started
	LatencyP50  *int64    `json:"latencyP50Ms"` // created → finished, over the recent calls that reached a replica; null without any
	LatencyP95  *int64    `json:"latencyP95Ms"`
	Finished    int       `json:"recentFinished"` // calls the latencies are taken over
	Replicas    []Replica `json:"replicas"`

	// LastErrorAt is when LastError happened; LastErrorReplica the replica
	// whose log tells more ("" for none).
	LastErrorAt      *time.Time `json:"lastErrorAt"`
	LastErrorReplica string     `json:"lastErrorReplica"`
	// RecentFailures counts the project's failed calls that finished within
	// failureWindow, among the recent calls.
	RecentFailures int `json:"recentFailures"`
	// BatchMaxSize is the project's batch.maxSize when it batches; Batches
	// and MeanBatchSize what it has sent since the daemon started.
	BatchMaxSize  int     `json:"batchMaxSize,omitempty"`
	Batches       int64   `json:"batches,omitempty"`
	MeanBatchSize float64 `json:"meanBatchSize,omitempty"`
	// ParkTimeout is the project's model.parkTimeout (0: it never parks),
	// and ParkingOff why it parks no more, if so (docs/gpu.md "Parking").
	ParkTimeout int    `json:"parkTimeout,omitempty"`
	ParkingOff  string `json:"parkingOff,omitempty"`
	// Queue is the first queued calls in dispatch order, each with why it
	// waits and when it should be done (the scheduler's estimate).
	Queue []scheduler.QueuedCall `json:"queue"`
}

type Replica struct {
	ID            string     `json:"id"`
	State         string     `json:"state"`
	Pid           int        `json:"pid"`
	GPUs          []int      `json:"gpus"` // GPU indexes
	Started       time.Time  `json:"started"`
	UptimeSeconds int64      `json:"uptimeSeconds"`
	InFlight      int        `json:"inFlight"`
	IdleExpiry    *time.Time `json:"idleExpiry"` // when the idle timeout stops it; null if not armed
	// ParkedSince is when it was parked, while it is: its GPUs are free
	// for others meanwhile.
	ParkedSince *time.Time `json:"parkedSince,omitempty"`
	// PreviousSpec: it runs an earlier spec of its project, replaced one by
	// one since the project changed (docs/operations.md, Rolling a project
	// onto new code).
	PreviousSpec bool `json:"previousSpec,omitempty"`
}

// Call is a call without its inputs or outputs.
type Call struct {
	ID         string     `json:"id"`
	ProjectID  string     `json:"projectId"`
	State      string     `json:"state"`
	Message    string     `json:"message,omitempty"` // failures only
	ReplicaID  string     `json:"replicaId,omitempty"`
	Attempt    int        `json:"attempt"`            // runs so far; above 1 after retries
	Priority   string     `json:"priority,omitempty"` // high or low; normal is left out
	Created    time.Time  `json:"created"`
	Dispatched *time.Time `json:"dispatched"`
	Finished   *time.Time `json:"finished"`
	QueueMs    int64      `json:"queueMs"`
	BootMs     int64      `json:"bootMs"`
	RunMs      int64      `json:"runMs"`
	TotalMs    *int64     `json:"totalMs"` // created → finished
}

type All struct {
	Generated time.Time      `json:"generated"`
	Scope     store.KeyScope `json:"scope"`
	TeamID    string         `json:"teamId"`
	GPUs      []GPU          `json:"gpus"`
	Projects  []Project      `json:"projects"`
	Calls     []Call         `json:"calls"`
	// Teams is each visible team's use against its quota (viewTeams).
	Teams    []scheduler.TeamStatus `json:"teams"`
	Webhooks *webhook.Stats         `json:"webhooks"` // the caller's teams' messages; null without a deliverer
	// Protections are the sandbox's: which ways of keeping models apart
	// are in force on this box (docs/security.md).
	Protections []backend.Protection `json:"protections"`
	// Cluster is the cluster view (cluster mode only; absent on a single box).
	Cluster *Cluster `json:"cluster,omitempty"`
	// Images is what this node's images take on disk; null when unknown.
	Images *Images `json:"images"`
}

// Images is the disk use of the images projects run in: their layer
// blobs as imported, and their unpacked roots.
type Images struct {
	Count      int   `json:"count"`
	LayerBytes int64 `json:"layerBytes"`
	RootBytes  int64 `json:"rootBytes"`
}

type Results[T any] struct {
	Results []T `json:"results"`
}

// view is what one request may see, read once.
type view struct {
	key      store.APIKey
	snapshot scheduler.Status
	projects []store.Project // visible, sorted by id
	calls    []store.Call    // visible, newest first, at most latencyWindow
}

func (s *api) read(r *http.Request, wantCalls bool) (view, error) {
	key, err := s.key(r)
	if err != nil {
		return view{}, err
	}
	v := view{key: key}
	team := key.TeamID
	if key.Scope == store.ScopeAdmin {
		team = ""
	}
	if v.projects, err = s.store.ListProjects(team); err != nil {
		return view{}, err
	}
	v.projects = slices.DeleteFunc(v.projects, func(p store.Project) bool { return !pipeline.Reaches(key, p.TeamID, p.ID) })
	slices.SortFunc(v.projects, func(x, y store.Project) int { return strings.Compare(x.ID, y.ID) })
	if s.src.Snapshot != nil {
		v.snapshot = s.src.Snapshot()
	}
	if wantCalls && s.src.Calls != nil {
		if v.calls, err = s.src.Calls.RecentCalls(team, latencyWindow); err != nil {
			return view{}, err
		}
		v.calls = slices.DeleteFunc(v.calls, func(c store.Call) bool { return !pipeline.Reaches(key, c.TeamID, c.ProjectID) })
	}
	return v, nil
}

// all handles GET /v1/status: everything the status page shows, in one read.
func (s *api) all(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	limit, err := respond.QueryInt(r, "limit", defaultStatusCalls, maxStatusCalls)
	if err != nil {
		respond.Error(w, r, s.log, err)
		return
	}
	v, err := s.read(r, true)
	if err != nil {
		respond.Error(w, r, s.log, err)
		return
	}
	respond.JSON(w, http.StatusOK, All{
		Generated:   s.now().UTC(),
		Scope:       v.key.Scope,
		TeamID:      v.key.TeamID,
		GPUs:        s.viewGPUs(v),
		Projects:    s.viewProjects(v),
		Calls:       viewCalls(v.calls, limit),
		Teams:       viewTeams(v),
		Webhooks:    s.webhookStats(v.key),
		Protections: s.protections(),
		Cluster:     viewCluster(s.clusterView, v),
		Images:      s.images(),
	})
}

// images is the images' disk use, or nil when it cannot be read.
func (s *api) images() *Images {
	if s.src.Images == nil {
		return nil
	}
	u, err := s.src.Images()
	if err != nil {
		s.log.Warn().Err(err).Msg("status: read the images' disk use")
		return nil
	}
	return &Images{Count: u.Images, LayerBytes: u.BlobBytes, RootBytes: u.RootBytes}
}

// protections are the backend's, or none known.
func (s *api) protections() []backend.Protection {
	if s.src.Protections == nil {
		return []backend.Protection{}
	}
	return s.src.Protections()
}

// webhookStats counts the webhook messages of the key's team, or of every
// team for an admin key.
func (s *api) webhookStats(key store.APIKey) *webhook.Stats {
	if s.src.Webhooks == nil {
		return nil
	}
	team := key.TeamID
	if key.Scope == store.ScopeAdmin {
		team = ""
	}
	st := s.src.Webhooks(team)
	return &st
}

// list returns a handler that answers {"results": render(view)} for one
// kind of status, reading the recent calls only when wantCalls.
func list[T any](s *api, wantCalls bool, render func(*http.Request, view) ([]T, error)) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
		v, err := s.read(r, wantCalls)
		var out []T
		if err == nil {
			out, err = render(r, v)
		}
		if err != nil {
			respond.Error(w, r, s.log, err)
			return
		}
		respond.JSON(w, http.StatusOK, Results[T]{out})
	}
}

// gpus renders GET /v1/status/gpus.
func (s *api) gpus(_ *http.Request, v view) ([]GPU, error) { return s.viewGPUs(v), nil }

// projects renders GET /v1/status/projects.
func (s *api) projects(_ *http.Request, v view) ([]Project, error) {
	return s.viewProjects(v), nil
}

// calls renders GET /v1/status/calls[?limit=N].
func (s *api) calls(r *http.Request, v view) ([]Call, error) {
	limit, err := respond.QueryInt(r, "limit", defaultStatusCalls, maxStatusCalls)
	return viewCalls(v.calls, limit), err
}

type Log struct {
	Project string   `json:"project"`
	Replica string   `json:"replica"`
	Lines   []string `json:"lines"`
}

// logs handles GET /v1/status/projects/:id/replicas/:replica/logs[?lines=N]:
// the last lines of a replica's log, running or not.
func (s *api) logs(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	n, err := respond.QueryInt(r, "lines", defaultLogLines, maxLogLines)
	if err != nil {
		respond.Error(w, r, s.log, err)
		return
	}
	key, err := s.key(r)
	if err != nil {
		respond.Error(w, r, s.log, err)
		return
	}
	id, rid := ps.ByName("id"), ps.ByName("replica")
	p, err := s.store.GetProject(id)
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && !pipeline.Reaches(key, p.TeamID, p.ID)):
		respond.Error(w, r, s.log, respond.ErrProjectNotFound)
		return
	case err != nil:
		respond.Error(w, r, s.log, err)
		return
	}
	// The replica id names a file: only ids the scheduler could have made.
	if s.src.Logs == nil || !store.ValidID(rid) || !strings.HasPrefix(rid, p.ID+"-") {
		respond.Error(w, r, s.log, respond.NotFound("no log for replica %s", respond.Truncate(rid, 64)))
		return
	}
	lines, _, err := s.src.Logs.TailLog(backend.Log{Team: p.TeamID, Project: p.ID, Replica: rid}, n)
	switch {
	case errors.Is(err, backend.ErrNoLog):
		respond.Error(w, r, s.log, respond.NotFound("no log for replica %s", rid))
		return
	case err != nil:
		respond.Error(w, r, s.log, err)
		return
	}
	if lines == nil {
		lines = []string{}
	}
	respond.JSON(w, http.StatusOK, Log{Project: p.ID, Replica: rid, Lines: lines})
}

func (s *api) viewGPUs(v view) []GPU {
	if s.src.GPUs == nil {
		return []GPU{}
	}
	holders := map[string]ReplicaName{} // GPU UUID → replica
	visible := map[string]bool{}
	for _, p := range v.projects {
		visible[p.ID] = true
	}
	// A shared GPU has several holders: name the first the caller may see,
	// so a team is never told its own replica's GPU is another team's.
	for _, p := range v.snapshot.Projects {
		for _, r := range p.Replicas {
			if !r.ParkedSince.IsZero() {
				continue // parked: its GPUs are free for others
			}
			for _, u := range r.GPUs {
				if h, ok := holders[u]; !ok || !visible[h.Project] {
					holders[u] = ReplicaName{Project: p.ID, Replica: r.ID}
				}
			}
		}
	}
	reserved := v.snapshot.ReservedMiB()
	devs := s.src.GPUs()
	out := make([]GPU, 0, len(devs))
	for _, d := range devs {
		m := gpu.MemoryOf(d, reserved)
		g := GPU{
			Index: d.Index, UUID: d.UUID, Name: d.Name,
			MemoryTotalBytes: m.Total, MemoryUsedBytes: m.Used, MemoryReservedBytes: m.Reserved,
			UtilizationPct: d.UtilizationPct,
			Simulated:      d.Simulated,
			Healthy:        d.Healthy(), Problem: d.Problem, MIG: d.MIG, Parent: d.Parent,
		}
		if h, ok := holders[d.UUID]; ok {
			g.Held = true
			if visible[h.Project] {
				g.HeldBy = &h
			}
		}
		out = append(out, g)
	}
	return out
}

func (s *api) viewProjects(v view) []Project {
	live := map[string]scheduler.ProjectStatus{}
	for _, p := range v.snapshot.Projects {
		live[p.ID] = p
	}
	index := map[string]int{} // GPU UUID → index
	if s.src.GPUs != nil {
		for _, d := range s.src.GPUs() {
			index[d.UUID] = d.Index
		}
	}
	now := s.now()
	reaches := func(teamID, projectID string) bool { return pipeline.Reaches(v.key, teamID, projectID) } // what a waiting reason may name
	latencies, failures := recentOutcomes(v.calls, now)
	out := make([]Project, 0, len(v.projects))
	for _, p := range v.projects {
		lp := live[p.ID]
		sp := Project{
			ID: p.ID, TeamID: p.TeamID,
			MinReplicas: p.MinReplicas, MaxReplicas: p.MaxReplicas, GPUs: p.Model.GPUDemand().GPUs,
			Queued: lp.Queued, Running: lp.Running, Waiting: explainWait(lp, v.snapshot, p.Model, reaches),
			LastError: lp.LastError, LastErrorReplica: lp.LastErrorReplica, RecentFailures: failures[p.ID],
			OOMKills: lp.OOMKills,
			Replicas: make([]Replica, 0, len(lp.Replicas)),
			Queue:    make([]scheduler.QueuedCall, 0, len(lp.Queue)),

			Batches: lp.Batches, MeanBatchSize: lp.MeanBatchSize,
			ParkTimeout: p.Model.ParkTimeout, ParkingOff: lp.ParkingOff,
			Durability: store.DurabilityStrict,
		}
		if p.AnswersFirst() {
			sp.Durability = store.DurabilityAnswered
		}
		for _, q := range lp.Queue {
			q.WaitingFor = q.WaitingFor.Shown(reaches)
			sp.Queue = append(sp.Queue, q)
		}
		if p.Model.Batch.On() {
			sp.BatchMaxSize = p.Model.Batch.MaxSize
		}
		if !lp.LastErrorAt.IsZero() {
			t := lp.LastErrorAt.UTC()
			sp.LastErrorAt = &t
		}
		lat := latencies[p.ID]
		sp.Finished = len(lat)
		sp.LatencyP50, sp.LatencyP95 = percentile(lat, 50), percentile(lat, 95)
		for _, r := range lp.Replicas {
			sp.Replicas = append(sp.Replicas, viewReplica(r, index, now))
		}
		out = append(out, sp)
	}
	return out
}

// recentOutcomes sums the finished calls of calls by project: their
// latencies, and how many failed within failureWindow of now.
func recentOutcomes(calls []store.Call, now time.Time) (latencies map[string][]int64, failures map[string]int) {
	latencies, failures = map[string][]int64{}, map[string]int{}
	for _, c := range calls {
		if !c.State.Done() || c.Finished.IsZero() {
			continue
		}
		if c.State == store.CallFailed && now.Sub(c.Finished) <= failureWindow {
			failures[c.ProjectID]++
		}
		// A call that never reached a replica (a failed boot, a full queue)
		// says nothing of how fast the model answers: no latency.
		if !c.Dispatched.IsZero() {
			latencies[c.ProjectID] = append(latencies[c.ProjectID], c.Finished.Sub(c.Created).Milliseconds())
		}
	}
	return latencies, failures
}

// viewReplica is replica r as the status shows it, its GPUs by index
// (index: GPU UUID → index).
func viewReplica(r scheduler.ReplicaStatus, index map[string]int, now time.Time) Replica {
	sr := Replica{
		ID: r.ID, State: r.State, Pid: r.Pid, Started: r.Started.UTC(),
		UptimeSeconds: int64(max(now.Sub(r.Started), 0) / time.Second),
		InFlight:      r.InFlight, GPUs: make([]int, 0, len(r.GPUs)),
		PreviousSpec: r.PreviousSpec,
	}
	for _, u := range r.GPUs {
		if i, ok := index[u]; ok {
			sr.GPUs = append(sr.GPUs, i)
		}
	}
	if !r.IdleExpiry.IsZero() {
		t := r.IdleExpiry.UTC()
		sr.IdleExpiry = &t
	}
	if !r.ParkedSince.IsZero() {
		t := r.ParkedSince.UTC()
		sr.ParkedSince = &t
	}
	return sr
}

// explainWait adds to the scheduler's reason a project waits what it waits
// on and the setting that decides it, e.g. "waiting for CPU slot: 2 of 2
// in use, see cpuSlots", or who holds it for good ("no CPU slot: the
// minReplicas of projects a, b hold all 2 cpuSlots", naming them only when
// reaches says the caller may see them all, else "other projects'").
func explainWait(lp scheduler.ProjectStatus, st scheduler.Status, m store.ModelSpec, reaches func(teamID, projectID string) bool) string {
	waiting := lp.Waiting
	if lp.HeldBy != nil {
		return lp.HeldBy.Shown(reaches).Text
	}
	switch waiting {
	case scheduler.WaitingCPU:
		return fmt.Sprintf("%s: %d of %d in use, see cpuSlots", waiting, st.CPUSlotsUsed, st.CPUSlots)
	case scheduler.WaitingGPU:
		held := 0
		for _, g := range st.GPUs {
			if len(g.Replicas) > 0 {
				held++
			}
		}
		d := m.GPUDemand()
		need := fmt.Sprintf("%d per replica", d.GPUs)
		if d.MemoryMiB > 0 {
			need = fmt.Sprintf("%d MiB of GPU memory per replica", d.MemoryMiB)
		}
		return fmt.Sprintf("%s: needs %s, %d of %d GPUs held, see gpus and gpuMemoryMiB", waiting, need, held, len(st.GPUs))
	}
	return waiting
}

func viewCalls(calls []store.Call, limit int) []Call {
	calls = calls[:min(limit, len(calls))]
	out := make([]Call, 0, len(calls))
	for _, c := range calls {
		sc := Call{
			ID: c.ID, ProjectID: c.ProjectID, State: string(c.State), ReplicaID: c.ReplicaID,
			Attempt: c.Attempt, Priority: string(c.Priority), Created: c.Created.UTC(), QueueMs: c.QueueMs, BootMs: c.BootMs, RunMs: c.RunMs,
		}
		if c.State == store.CallFailed {
			sc.Message = respond.Truncate(respond.FailureMessage(c.Message), maxStatusMessage)
		}
		if !c.Dispatched.IsZero() {
			t := c.Dispatched.UTC()
			sc.Dispatched = &t
		}
		if !c.Finished.IsZero() {
			t := c.Finished.UTC()
			total := t.Sub(c.Created).Milliseconds()
			sc.Finished, sc.TotalMs = &t, &total
		}
		out = append(out, sc)
	}
	return out
}

// percentile returns the nearest-rank p-th percentile of xs, or nil for none.
// xs is sorted in place.
func percentile(xs []int64, p int) *int64 {
	if len(xs) == 0 {
		return nil
	}
	slices.Sort(xs)
	rank := (p*len(xs) + 99) / 100 // ceil(p/100 · n), 1-based
	v := xs[max(rank, 1)-1]
	return &v
}
