package store

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"
)

// The usage ledger (DESIGN.md "Batching, usage, ETA"): what each call used
// is kept with its final record, one write (Call.Usage), and the store
// adds it, in the same commit, to the hourly roll-up of its team and
// project (UsageRow). The scheduler adds the replica time no call used,
// booting and idle, to the same roll-ups now and then (AddUsage), charged
// to the project that kept the replica. Roll-ups are kept for a retention
// period (ExpireUsage), calls only for resultTTL.

// CallUsage is what one call used, the ledger's entry for it; its queue,
// boot and run times are the call's own QueueMs, BootMs and RunMs. A nil
// pointer is a measure the box could not take (no cgroup, no energy
// counter): absent, not zero.
type CallUsage struct {
	// ReplicaSeconds is the call's share of its replica's time: a replica
	// running k calls at once charges each of them 1/k of each second.
	ReplicaSeconds float64 `json:"replicaSeconds"`
	// GPUSeconds is ReplicaSeconds times the GPUs the replica holds, a
	// share of one by memory counted as its fraction of the GPU's memory.
	GPUSeconds float64 `json:"gpuSeconds,omitempty"`
	// CPUSeconds is the CPU time of the replica's cgroup over the call,
	// the call's share of it as of ReplicaSeconds.
	CPUSeconds *float64 `json:"cpuSeconds,omitempty"`
	// PeakMemoryBytes is the replica's cgroup's memory high-water mark
	// over the call (since the replica started where the kernel cannot
	// reset it); 0 when not measured.
	PeakMemoryBytes int64 `json:"peakMemoryBytes,omitempty"`
	BytesIn         int64 `json:"bytesIn"`  // the inputs as stored
	BytesOut        int64 `json:"bytesOut"` // the outputs as stored
	// EnergyJoules is the call's share of the energy its replica's GPUs
	// used over the call, from NVML's total-energy counter.
	EnergyJoules *float64 `json:"energyJoules,omitempty"`
	// PromptTokens and CompletionTokens are what an OpenAI-compatible
	// model reported the call used (Call.Tokens); 0 for other protocols.
	PromptTokens     int64 `json:"promptTokens,omitempty"`
	CompletionTokens int64 `json:"completionTokens,omitempty"`
}

// UsageRow is one hour of one project's use: the sum of its calls that
// finished in the hour plus the replica time it kept booting or idle.
type UsageRow struct {
	Hour      time.Time `json:"hour"` // UTC, on the hour
	TeamID    string    `json:"teamId"`
	ProjectID string    `json:"projectId"`
	UsageTotals
}

// UsageTotals are the figures of the ledger, summed over whatever a row
// or a report covers.
type UsageTotals struct {
	Calls  int64 `json:"calls"`  // calls finished
	Failed int64 `json:"failed"` // of them, failed
	// The calls' own times: waiting in the queue, waiting for a boot
	// (part of the queue time), and running.
	QueueSeconds    float64  `json:"queueSeconds"`
	BootWaitSeconds float64  `json:"bootWaitSeconds"`
	RunSeconds      float64  `json:"runSeconds"`
	ReplicaSeconds  float64  `json:"replicaSeconds"` // the calls' shares (CallUsage)
	GPUSeconds      float64  `json:"gpuSeconds"`
	CPUSeconds      *float64 `json:"cpuSeconds,omitempty"` // nil: no call of the row was measured
	PeakMemoryBytes int64    `json:"peakMemoryBytes"`      // the highest of its calls'
	BytesIn         int64    `json:"bytesIn"`
	BytesOut        int64    `json:"bytesOut"`
	EnergyJoules    *float64 `json:"energyJoules,omitempty"` // nil: no call of the row had an energy reading
	// Tokens the calls' OpenAI-compatible models reported (CallUsage).
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`

	// Replica time no call used, charged to the project that kept the
	// replica: booting, and ready with nothing to do (kept warm by
	// minReplicas or waiting out idleTimeout; stopping counts here too).
	BootReplicaSeconds float64 `json:"bootReplicaSeconds"`
	IdleReplicaSeconds float64 `json:"idleReplicaSeconds"`
	BootGPUSeconds     float64 `json:"bootGPUSeconds"`
	IdleGPUSeconds     float64 `json:"idleGPUSeconds"`
}

// Usage is the ledger's hourly roll-ups. The per-call entries are the
// calls' own (Calls: a call's first final write that carries Usage adds
// it to its hour's row in the same commit, exactly once however often the
// final record is written again).
type Usage interface {
	// AddUsage adds each row to the stored row of its hour (truncated to
	// the hour), team and project, creating it, all in one commit: all
	// or nothing. Rows that name no team or project are a
	// *ValidationError.
	AddUsage(rows []UsageRow) error
	// UsageRows returns the rows of teamID ("" = every team) whose hour
	// is in [from, to), sorted by hour, team, project; never nil.
	UsageRows(teamID string, from, to time.Time) ([]UsageRow, error)
	// ExpireUsage deletes the rows of hours before `before` and returns
	// how many.
	ExpireUsage(before time.Time) (int, error)
}

// UsageHour is the hour t falls in, in UTC.
func UsageHour(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) }

// Key orders rows and names the one a row adds to: its hour, team and
// project.
func (r UsageRow) Key() UsageKey { return UsageKey{UsageHour(r.Hour), r.TeamID, r.ProjectID} }

// UsageKey names one hourly row.
type UsageKey struct {
	Hour      time.Time
	TeamID    string
	ProjectID string
}

// Compare orders keys by hour, team, project.
func (k UsageKey) Compare(o UsageKey) int {
	return cmp.Or(k.Hour.Compare(o.Hour), strings.Compare(k.TeamID, o.TeamID), strings.Compare(k.ProjectID, o.ProjectID))
}

// Add adds o's figures to r (keeping r's key).
func (r *UsageRow) Add(o UsageRow) { r.UsageTotals.Add(o.UsageTotals) }

// Add adds o to t: sums, and the higher peak. A measure absent from both
// stays absent. The counts saturate at math.MaxInt64 rather than wrap: a
// model reports its own token counts, and no total may go down or negative
// however large what it reports (openai.Usage clamps each call's to
// MaxTokens, and rows add up over hours and teams).
func (r *UsageTotals) Add(o UsageTotals) {
	r.Calls = AddCount(r.Calls, o.Calls)
	r.Failed = AddCount(r.Failed, o.Failed)
	r.QueueSeconds += o.QueueSeconds
	r.BootWaitSeconds += o.BootWaitSeconds
	r.RunSeconds += o.RunSeconds
	r.ReplicaSeconds += o.ReplicaSeconds
	r.GPUSeconds += o.GPUSeconds
	r.CPUSeconds = addOptional(r.CPUSeconds, o.CPUSeconds)
	r.PeakMemoryBytes = max(r.PeakMemoryBytes, o.PeakMemoryBytes)
	r.BytesIn = AddCount(r.BytesIn, o.BytesIn)
	r.BytesOut = AddCount(r.BytesOut, o.BytesOut)
	r.EnergyJoules = addOptional(r.EnergyJoules, o.EnergyJoules)
	r.PromptTokens = AddCount(r.PromptTokens, o.PromptTokens)
	r.CompletionTokens = AddCount(r.CompletionTokens, o.CompletionTokens)
	r.BootReplicaSeconds += o.BootReplicaSeconds
	r.IdleReplicaSeconds += o.IdleReplicaSeconds
	r.BootGPUSeconds += o.BootGPUSeconds
	r.IdleGPUSeconds += o.IdleGPUSeconds
}

// AddCount adds two counts, saturating: a negative one counts as none,
// and a sum past math.MaxInt64 stays there rather than wrapping to a
// negative number.
func AddCount(a, b int64) int64 {
	a, b = max(a, 0), max(b, 0)
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func addOptional(a, b *float64) *float64 {
	switch {
	case a == nil && b == nil:
		return nil
	case a == nil:
		v := *b
		return &v
	case b == nil:
		v := *a
		return &v
	}
	v := *a + *b
	return &v
}

// Validate checks that the row names its team and project.
func (r UsageRow) Validate() error {
	switch {
	case r.TeamID == "":
		return invalid("teamId", "a usage row needs its team")
	case r.ProjectID == "":
		return invalid("projectId", "a usage row needs its project")
	}
	return nil
}

// CallUsageRow is what final call c adds to the ledger, and whether it
// adds anything: only a final call with Usage does.
func CallUsageRow(c Call) (UsageRow, bool) {
	if !c.State.Done() || c.Usage == nil || c.TeamID == "" || c.ProjectID == "" {
		return UsageRow{}, false
	}
	u := c.Usage
	r := UsageRow{Hour: UsageHour(c.Finished), TeamID: c.TeamID, ProjectID: c.ProjectID}
	r.UsageTotals = UsageTotals{
		Calls:           1,
		QueueSeconds:    float64(c.QueueMs) / 1000,
		BootWaitSeconds: float64(c.BootMs) / 1000,
		RunSeconds:      float64(c.RunMs) / 1000,
		ReplicaSeconds:  u.ReplicaSeconds,
		GPUSeconds:      u.GPUSeconds,
		CPUSeconds:      addOptional(nil, u.CPUSeconds),
		PeakMemoryBytes: u.PeakMemoryBytes,
		BytesIn:         u.BytesIn,
		BytesOut:        u.BytesOut,
		EnergyJoules:    addOptional(nil, u.EnergyJoules),

		PromptTokens:     u.PromptTokens,
		CompletionTokens: u.CompletionTokens,
	}
	if c.State == CallFailed {
		r.Failed = 1
	}
	return r, true
}

// SumUsage adds rows up by key: one row per hour, team and project, sorted
// by key. Stores use it to fold what they add.
func SumUsage(rows []UsageRow) []UsageRow {
	by := map[UsageKey]*UsageRow{}
	var keys []UsageKey
	for _, r := range rows {
		k := r.Key()
		sum, ok := by[k]
		if !ok {
			sum = &UsageRow{Hour: k.Hour, TeamID: k.TeamID, ProjectID: k.ProjectID}
			by[k] = sum
			keys = append(keys, k)
		}
		sum.Add(r)
	}
	slices.SortFunc(keys, UsageKey.Compare)
	out := make([]UsageRow, 0, len(keys))
	for _, k := range keys {
		out = append(out, *by[k])
	}
	return out
}
