package storetest

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"inferd/store"
)

// Tenancy: team quotas, project caps and scoped keys are durable fields
// like any other.

func testTeamQuotaSetGetAndReopen(t *testing.T, e *env) {
	s := e.open(t)
	var (
		mu      sync.Mutex
		changed []string
	)
	s.OnTeamChange(func(id string) {
		mu.Lock()
		defer mu.Unlock()
		changed = append(changed, id)
	})
	if _, err := s.GetTeam("acme"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetTeam(missing) = %v, want ErrNotFound", err)
	}
	q := store.Quota{Replicas: 8, GPUs: 2, CPUSlots: 2, QueuedCalls: 5000, QueuedBytes: 2 << 30, RunningCalls: 32}
	team, err := s.SetTeamQuota("acme", q)
	if err != nil || team.ID != "acme" || team.Quota != q {
		t.Fatalf("SetTeamQuota = %+v, %v; want acme with %v", team, err, q)
	}
	if _, err := s.SetTeamQuota("acme", q); err != nil { // no change: no hook
		t.Fatal(err)
	}
	var ve *store.ValidationError
	if _, err := s.SetTeamQuota("acme", store.Quota{GPUs: -1}); !errors.As(err, &ve) || ve.Field != "quota.gpus" {
		t.Errorf("SetTeamQuota(negative) = %v, want a validation error on quota.gpus", err)
	}
	if _, err := s.SetTeamQuota("Bad Team", q); !errors.As(err, &ve) {
		t.Errorf("SetTeamQuota(bad id) = %v, want a validation error", err)
	}
	mu.Lock()
	if !slices.Equal(changed, []string{"acme"}) {
		t.Errorf("OnTeamChange saw %v, want [acme] (one change)", changed)
	}
	mu.Unlock()
	s = e.reopen(t, s)
	got, err := s.GetTeam("acme")
	if err != nil || got.Quota != q {
		t.Errorf("after reopen GetTeam = %+v, %v; want quota %v", got, err, q)
	}
	teams, err := s.ListTeams()
	if err != nil || len(teams) != 1 || teams[0].Quota != q {
		t.Errorf("ListTeams = %+v, %v", teams, err)
	}
}

func testScopedKeyKeepsItsLimits(t *testing.T, e *env) {
	s := e.open(t)
	exp := e.clock.Now().Add(30 * 24 * time.Hour)
	lim := store.KeyLimits{Permissions: []store.Permission{store.PermRead}, Expires: exp, Projects: []string{"a", "b"}}
	secret, k, err := s.CreateScopedKey("acme", store.ScopeTeam, lim)
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, got store.APIKey) {
		t.Helper()
		if !slices.Equal(got.Permissions, lim.Permissions) || !got.Expires.Equal(exp) || !slices.Equal(got.Projects, lim.Projects) {
			t.Errorf("%s: key limits = %+v, want %+v", when, got.KeyLimits, lim)
		}
		if got.Allows(store.PermInfer) || !got.Allows(store.PermRead) || got.ReachesProject("c") || !got.ReachesProject("a") {
			t.Errorf("%s: key reach is wrong: %+v", when, got.KeyLimits)
		}
	}
	check("created", k)
	s = e.reopen(t, s)
	got, err := s.Authenticate(secret)
	if err != nil {
		t.Fatal(err)
	}
	check("authenticated", got)
	keys, err := s.ListKeys("acme")
	if err != nil || len(keys) != 1 {
		t.Fatalf("ListKeys = %+v, %v", keys, err)
	}
	check("listed", keys[0])

	for _, bad := range []struct {
		name  string
		scope store.KeyScope
		lim   store.KeyLimits
	}{
		{"unknown permission", store.ScopeTeam, store.KeyLimits{Permissions: []store.Permission{"root"}}},
		{"bad project id", store.ScopeTeam, store.KeyLimits{Projects: []string{"Not An Id"}}},
		{"admin with permissions", store.ScopeAdmin, store.KeyLimits{Permissions: []store.Permission{store.PermRead}}},
	} {
		var ve *store.ValidationError
		if _, _, err := s.CreateScopedKey("acme", bad.scope, bad.lim); !errors.As(err, &ve) {
			t.Errorf("%s: CreateScopedKey = %v, want a validation error", bad.name, err)
		}
	}
}

func testProjectCapsAreKeptAndValidated(t *testing.T, e *env) {
	s := e.open(t)
	p := Project("p", "acme")
	p.Caps = store.ProjectCaps{MaxReplicas: 4, MinReplicas: 1}
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
	s = e.reopen(t, s)
	got, err := s.GetProject("p")
	if err != nil || got.Caps != p.Caps {
		t.Errorf("GetProject = %+v, %v; want caps %+v", got.Caps, err, p.Caps)
	}
	p.Caps.MaxReplicas = store.MaxReplicasLimit + 1
	var ve *store.ValidationError
	if _, err := s.PutProject(p); !errors.As(err, &ve) || ve.Field != "caps.maxReplicas" {
		t.Errorf("PutProject(cap over the limit) = %v, want a validation error on caps.maxReplicas", err)
	}
}
