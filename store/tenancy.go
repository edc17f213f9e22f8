package store

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Quota bounds what one team may hold of a shared box; an admin sets it (the
// manifest's teams: entries, `inferd team set`). Each field is a maximum, and
// 0 means unlimited, so a box with no quotas behaves as if it had no teams.
type Quota struct {
	Replicas     int   `json:"replicas,omitempty" yaml:"replicas"`         // live replicas, all projects of the team
	GPUs         int   `json:"gpus,omitempty" yaml:"gpus"`                 // GPUs held by its replicas
	CPUSlots     int   `json:"cpuSlots,omitempty" yaml:"cpuSlots"`         // CPU slots held by its CPU replicas
	QueuedCalls  int   `json:"queuedCalls,omitempty" yaml:"queuedCalls"`   // calls waiting in its queues
	QueuedBytes  int64 `json:"queuedBytes,omitempty" yaml:"queuedBytes"`   // their inputs, summed
	RunningCalls int   `json:"runningCalls,omitempty" yaml:"runningCalls"` // calls running at once
}

// MaxQuota bounds each quota field, so that sums over teams cannot overflow.
const MaxQuota = 1 << 40

// Validate checks that every field is between 0 (unlimited) and MaxQuota.
func (q Quota) Validate() error {
	for _, f := range q.fields() {
		if f.value < 0 || f.value > MaxQuota {
			return invalid("quota."+f.name, "must be between 0 (unlimited) and %d", int64(MaxQuota))
		}
	}
	return nil
}

// ValidateTeamQuota checks a SetTeamQuota request: the team id and the
// quota, each a *ValidationError when bad.
func ValidateTeamQuota(id string, q Quota) error {
	if err := ValidateTeamID(id); err != nil {
		return err
	}
	return q.Validate()
}

// quotaField is one quota field by its JSON name.
type quotaField struct {
	name  string
	value int64
}

func (q Quota) fields() []quotaField {
	return []quotaField{
		{"replicas", int64(q.Replicas)}, {"gpus", int64(q.GPUs)}, {"cpuSlots", int64(q.CPUSlots)},
		{"queuedCalls", int64(q.QueuedCalls)}, {"queuedBytes", q.QueuedBytes}, {"runningCalls", int64(q.RunningCalls)},
	}
}

// String lists the limits that are set, e.g. "replicas=8 gpus=2", or
// "unlimited".
func (q Quota) String() string {
	var parts []string
	for _, f := range q.fields() {
		if f.value > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", f.name, f.value))
		}
	}
	if len(parts) == 0 {
		return "unlimited"
	}
	return strings.Join(parts, " ")
}

// QuotaError says which team quota (or project cap) a request would go
// beyond. Its text names the limit, for the 400 of the project API, apply
// and `error:` messages.
type QuotaError struct {
	Team  string // "" for a project cap
	Limit string // e.g. "replicas quota" or "caps.maxReplicas"
	Max   int64
	Want  int64
	What  string // what would exceed it, e.g. "minReplicas of its projects"
}

func (e *QuotaError) Error() string {
	if e.Team == "" {
		return fmt.Sprintf("%s would be %d, over the project's admin cap %s of %d", e.What, e.Want, e.Limit, e.Max)
	}
	return fmt.Sprintf("%s would be %d, over team %s's %s of %d", e.What, e.Want, e.Team, e.Limit, e.Max)
}

// ProjectCaps are an admin's bounds (manifest caps:) on the replica
// settings a team may give a project through the project API; 0 = no cap.
type ProjectCaps struct {
	MaxReplicas int `json:"maxReplicas,omitempty" yaml:"maxReplicas"`
	MinReplicas int `json:"minReplicas,omitempty" yaml:"minReplicas"`
}

func (c ProjectCaps) validate() error {
	switch {
	case c.MaxReplicas < 0 || c.MaxReplicas > MaxReplicasLimit:
		return invalid("caps.maxReplicas", "must be between 0 (no cap) and %d", MaxReplicasLimit)
	case c.MinReplicas < 0 || c.MinReplicas > MaxReplicasLimit:
		return invalid("caps.minReplicas", "must be between 0 (no cap) and %d", MaxReplicasLimit)
	}
	return nil
}

// CheckCaps reports a *QuotaError when p's replica settings go beyond its
// admin caps.
func (p Project) CheckCaps() error {
	switch {
	case p.Caps.MaxReplicas > 0 && p.MaxReplicas > p.Caps.MaxReplicas:
		return &QuotaError{Limit: "caps.maxReplicas", Max: int64(p.Caps.MaxReplicas), Want: int64(p.MaxReplicas), What: "maxReplicas"}
	case p.Caps.MinReplicas > 0 && p.MinReplicas > p.Caps.MinReplicas:
		return &QuotaError{Limit: "caps.minReplicas", Max: int64(p.Caps.MinReplicas), Want: int64(p.MinReplicas), What: "minReplicas"}
	}
	return nil
}

// CheckProjects reports a *QuotaError when the projects of team (every
// project of the team, as they would be) guarantee more than q allows:
// their minReplicas together hold replicas, GPUs and CPU slots that are
// never given back, so their sum must fit the quota, or one team could hold
// the whole box. A single project's maxReplicas may not exceed the replica
// quota either: those replicas could never all run.
func (q Quota) CheckProjects(team string, projects []Project) error {
	var replicas, gpus, cpu int64
	for _, p := range projects {
		if q.Replicas > 0 && p.MaxReplicas > q.Replicas {
			return &QuotaError{Team: team, Limit: "replicas quota", Max: int64(q.Replicas), Want: int64(p.MaxReplicas),
				What: "maxReplicas of project " + p.ID}
		}
		replicas += int64(p.MinReplicas)
		if n := p.Model.GPUDemand().GPUs; n > 0 {
			gpus += int64(p.MinReplicas) * int64(n)
		} else {
			cpu += int64(p.MinReplicas)
		}
	}
	for _, c := range []struct {
		limit string
		max   int
		want  int64
		what  string
	}{
		{"replicas quota", q.Replicas, replicas, "the sum of minReplicas of its projects"},
		{"gpus quota", q.GPUs, gpus, "the GPUs its projects' minReplicas hold"},
		{"cpuSlots quota", q.CPUSlots, cpu, "the CPU slots its projects' minReplicas hold"},
	} {
		if c.max > 0 && c.want > int64(c.max) {
			return &QuotaError{Team: team, Limit: c.limit, Max: int64(c.max), Want: c.want, What: c.what}
		}
	}
	return nil
}

// Permission is what a team key may do. A key holds a set of them; none
// listed means all three, as keys had before scopes.
type Permission string

// Permissions of a team key.
const (
	PermInfer  Permission = "infer"  // start and check calls
	PermRead   Permission = "read"   // GET projects, status
	PermManage Permission = "manage" // PUT projects
)

// AllPermissions are a team key's default: everything its team may do.
var AllPermissions = []Permission{PermInfer, PermRead, PermManage}

// ParsePermissions reads a comma-separated list such as "infer,read". An
// empty list is all three.
func ParsePermissions(s string) ([]Permission, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []Permission
	for _, part := range strings.Split(s, ",") {
		p := Permission(strings.TrimSpace(part))
		if !slices.Contains(AllPermissions, p) {
			return nil, invalid("scope", "%q is not one of infer, read, manage", truncateID(string(p)))
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// KeyLimits narrow what a team key may do: its permissions (nil = all), the
// moment it stops working (zero = never) and the projects it may reach
// (nil = every project of its team).
type KeyLimits struct {
	Permissions []Permission `json:"permissions,omitempty"`
	Expires     time.Time    `json:"expires,omitzero"`
	Projects    []string     `json:"projects,omitempty"`
}

func (l KeyLimits) validate(scope KeyScope) error {
	for _, p := range l.Permissions {
		if !slices.Contains(AllPermissions, p) {
			return invalid("permissions", "%q is not one of infer, read, manage", truncateID(string(p)))
		}
	}
	for _, id := range l.Projects {
		if !ValidID(id) {
			return invalid("projects", "%q: %s", truncateID(id), idRule)
		}
	}
	if scope == ScopeAdmin && (len(l.Permissions) > 0 || len(l.Projects) > 0) {
		return invalid("scope", "an admin key reaches everything: it takes no permissions or projects")
	}
	return nil
}

func truncateID(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Allows reports whether the key holds permission p. An admin key and a key
// with no permissions listed hold all of them.
func (k APIKey) Allows(p Permission) bool {
	return k.Scope == ScopeAdmin || len(k.Permissions) == 0 || slices.Contains(k.Permissions, p)
}

// ExpiredAt reports whether the key has expired by now.
func (k APIKey) ExpiredAt(now time.Time) bool { return !k.Expires.IsZero() && !now.Before(k.Expires) }

// ReachesProject reports whether the key's project allowlist (if any)
// includes project id. It does not look at teams.
func (k APIKey) ReachesProject(id string) bool {
	return len(k.Projects) == 0 || slices.Contains(k.Projects, id)
}

// ScopeText is the key's reach as `key list` shows it: "admin", or its
// permissions joined by commas.
func (k APIKey) ScopeText() string {
	if k.Scope == ScopeAdmin {
		return string(ScopeAdmin)
	}
	ps := k.Permissions
	if len(ps) == 0 {
		ps = AllPermissions
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, ",")
}

// ParseBytes reads a size such as "2GiB", "512MiB", "100kB" or "1048576"
// (bytes). Binary (KiB, MiB, GiB, TiB) and decimal (kB, MB, GB, TB) units
// are accepted.
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a whole number of bytes, optionally with a unit (KiB, MiB, GiB, kB, MB, GB)", truncateID(s))
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large", truncateID(s))
	}
	return n * mult, nil
}
