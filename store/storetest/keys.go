package storetest

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

func testEnsureTeamAndListTeams(t *testing.T, e *env) {
	s := e.open(t)
	for _, tc := range []struct {
		id      string
		created bool
	}{{"b", true}, {"a", true}, {"b", false}} {
		created, err := s.EnsureTeam(tc.id)
		if err != nil || created != tc.created {
			t.Errorf("EnsureTeam(%s) = %v, %v; want %v", tc.id, created, err, tc.created)
		}
	}
	var ve *store.ValidationError
	if _, err := s.EnsureTeam("Not A Team"); !errors.As(err, &ve) || ve.Field != "teamId" {
		t.Errorf("EnsureTeam(invalid) = %v, want a validation error on teamId", err)
	}
	teams, err := s.ListTeams()
	if err != nil || len(teams) != 2 || teams[0].ID != "a" || teams[1].ID != "b" || !teams[0].Created.Equal(e.clock.Now()) {
		t.Errorf("ListTeams = %+v, %v; want a then b, stamped now", teams, err)
	}
}

func testCreateAuthenticateRevokeKey(t *testing.T, e *env) {
	s := e.open(t)
	secret, k, err := s.CreateKey("acme", "")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^ik_[0-9a-f]{10}_[A-Za-z0-9_-]{43}$`).MatchString(secret) {
		t.Errorf("secret %q has the wrong shape", secret)
	}
	if k.Scope != store.ScopeTeam || k.TeamID != "acme" || k.Hash != store.HashKeySecret(secret) || strings.Contains(k.Hash, secret) {
		t.Errorf("key = %+v", k)
	}
	if teams, _ := s.ListTeams(); len(teams) != 1 || teams[0].ID != "acme" {
		t.Errorf("CreateKey did not create the team: %+v", teams)
	}
	for range 2 { // the second time from the cache
		got, err := s.Authenticate(secret)
		if err != nil || got.ID != k.ID {
			t.Fatalf("Authenticate = %+v, %v", got, err)
		}
	}
	if err := s.RevokeKey(k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(secret); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("Authenticate after revoke = %v, want ErrInvalidKey", err)
	}
	if err := s.RevokeKey(k.ID); err != nil {
		t.Errorf("second RevokeKey = %v, want nil", err)
	}
	if err := s.RevokeKey("0123456789"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RevokeKey(unknown) = %v, want ErrNotFound", err)
	}
	keys, err := s.ListKeys("acme")
	if err != nil || len(keys) != 1 || !keys[0].IsRevoked() {
		t.Errorf("ListKeys = %+v, %v; want one revoked key", keys, err)
	}
}

func testCreateKeyValidates(t *testing.T, e *env) {
	s := e.open(t)
	for _, tc := range []struct {
		name  string
		team  string
		scope store.KeyScope
		field string
	}{
		{"empty team", "", store.ScopeTeam, "teamId"},
		{"bad team", "Acme", store.ScopeTeam, "teamId"},
		{"bad scope", "acme", "root", "scope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := s.CreateKey(tc.team, tc.scope)
			var ve *store.ValidationError
			if !errors.As(err, &ve) || ve.Field != tc.field {
				t.Errorf("CreateKey = %v, want a validation error on %s", err, tc.field)
			}
		})
	}
}

func testListKeysSortedByTeamThenCreated(t *testing.T, e *env) {
	clock := e.clock
	s := e.open(t)
	for _, team := range []string{"b", "a", "b", "a"} {
		clock.Advance(time.Second)
		if _, _, err := s.CreateKey(team, store.ScopeTeam); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		team  string
		teams []string
	}{
		{"all", "", []string{"a", "a", "b", "b"}},
		{"one team", "b", []string{"b", "b"}},
		{"unknown team", "zzz", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := s.ListKeys(tc.team)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != len(tc.teams) {
				t.Fatalf("got %d keys, want %d", len(keys), len(tc.teams))
			}
			for i, k := range keys {
				if k.TeamID != tc.teams[i] {
					t.Errorf("key %d team = %s, want %s", i, k.TeamID, tc.teams[i])
				}
				if i > 0 && k.TeamID == keys[i-1].TeamID && !k.Created.After(keys[i-1].Created) {
					t.Errorf("key %d not after key %d", i, i-1)
				}
			}
		})
	}
}

func testAuthenticateRejectsBadSecrets(t *testing.T, e *env) {
	s := e.open(t)
	secret, k, err := s.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	rest := secret[len("ik_")+10:]
	for _, tc := range []struct {
		name   string
		secret string
	}{
		{"empty", ""},
		{"prefix only", "ik_"},
		{"no secret part", "ik_" + k.ID + "_"},
		{"wrong prefix", "xk_" + k.ID + rest},
		{"uppercase id", "ik_" + upperID(k.ID) + rest},
		{"short id", "ik_" + k.ID[:9] + rest},
		{"unknown id", "ik_ffffffffff" + rest},
		{"wrong secret", secret[:len(secret)-1] + flip(secret[len(secret)-1])},
		{"extra character", secret + "a"},
		{"bad character", secret[:len(secret)-1] + "!"},
		{"too long", secret + strings.Repeat("a", 200)},
		{"whitespace", " " + secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := s.Authenticate(tc.secret); !errors.Is(err, store.ErrInvalidKey) {
				t.Errorf("Authenticate(%q) = %+v, %v; want ErrInvalidKey", tc.secret, got, err)
			}
		})
	}
}

// upperID is id in upper case; an id of digits only (about 1 in 100 for ten
// random hex digits) has its first digit made a letter, so the case always
// differs from the key's.
func upperID(id string) string {
	up := strings.ToUpper(id)
	if up == id {
		up = "A" + up[1:]
	}
	return up
}

// A revocation must win over a concurrent authentication that filled the
// cache from a read made before the revocation committed.
func testRevokeTakesEffectDespiteConcurrentAuthentication(t *testing.T, e *env) {
	s := e.open(t)
	for range 20 {
		secret, k, err := s.CreateKey("acme", store.ScopeTeam)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					_, _ = s.Authenticate(secret)
				}
			}
		}()
		if err := s.RevokeKey(k.ID); err != nil {
			t.Fatal(err)
		}
		// Let the racing goroutine finish any lookup it started, then check.
		close(stop)
		<-done
		if _, err := s.Authenticate(secret); !errors.Is(err, store.ErrInvalidKey) {
			t.Fatalf("revoked key still authenticates: %v", err)
		}
	}
}

// Every read that takes a team returns that team's records only: the API
// layer relies on it to keep teams apart (a team key lists its own projects,
// keys and calls; an admin key passes "").
func testReadsByTeamSeeOnlyThatTeam(t *testing.T, e *env) {
	s := e.open(t)
	for _, team := range []string{"acme", "other"} {
		if _, _, err := s.CreateKey(team, store.ScopeTeam); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{team + "-1", team + "-2"} {
			if _, err := s.PutProject(Project(id, team)); err != nil {
				t.Fatal(err)
			}
			c := store.Call{ID: newCallID(), ProjectID: id, TeamID: team, State: store.CallQueued}
			if err := s.SaveCall(context.Background(), c); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, team := range []string{"acme", "other"} {
		t.Run(team, func(t *testing.T) {
			ps, err := s.ListProjects(team)
			if err != nil || len(ps) != 2 || ps[0].TeamID != team || ps[1].TeamID != team {
				t.Errorf("ListProjects(%s) = %+v, %v", team, ps, err)
			}
			keys, err := s.ListKeys(team)
			if err != nil || len(keys) != 1 || keys[0].TeamID != team {
				t.Errorf("ListKeys(%s) = %+v, %v", team, keys, err)
			}
			calls, err := s.RecentCalls(team, 10)
			if err != nil || len(calls) != 2 || calls[0].TeamID != team || calls[1].TeamID != team {
				t.Errorf("RecentCalls(%s) = %+v, %v", team, calls, err)
			}
			// A project found by modelKey carries its team, which the API
			// compares with the caller's.
			p, err := s.ProjectByModelKey("key-" + team + "-1")
			if err != nil || p.TeamID != team {
				t.Errorf("ProjectByModelKey = %+v, %v", p, err)
			}
		})
	}
	all, err := s.ListProjects("")
	var ids []string
	for _, p := range all {
		ids = append(ids, p.ID)
	}
	if err != nil || !slices.Equal(ids, []string{"acme-1", "acme-2", "other-1", "other-2"}) {
		t.Errorf("ListProjects(all) = %v, %v", ids, err)
	}
	if keys, err := s.ListKeys(""); err != nil || len(keys) != 2 {
		t.Errorf("ListKeys(all) = %d keys, %v", len(keys), err)
	}
	if calls, err := s.RecentCalls("", 10); err != nil || len(calls) != 4 {
		t.Errorf("RecentCalls(all) = %d calls, %v", len(calls), err)
	}
}

// A caller changing a record it was given never changes what the store
// holds, nor what other callers get.
func testRecordsHandedOutAreCopies(t *testing.T, e *env) {
	s := e.open(t)
	p := Project("p", "t")
	p.Model.Env = map[string]string{"A": "1"}
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
	p.Model.Env["A"], p.Model.Command[0] = "changed", "/changed" // the caller's own copy
	got, err := s.GetProject("p")
	if err != nil {
		t.Fatal(err)
	}
	got.Model.Env["A"], got.Model.Command[0] = "changed", "/changed"
	list, err := s.ListProjects("")
	if err != nil {
		t.Fatal(err)
	}
	list[0].Model.Env["A"] = "changed"
	if _, err := s.UpdateProject("p", func(p *store.Project) error {
		p.Model.Env["A"] = "aborted"
		return context.Canceled
	}); err == nil {
		t.Fatal("an update whose fn failed succeeded")
	}
	for _, read := range []func() (store.Project, error){
		func() (store.Project, error) { return s.GetProject("p") },
		func() (store.Project, error) { return s.ProjectByModelKey("key-p") },
	} {
		got, err := read()
		if err != nil || got.Model.Env["A"] != "1" || got.Model.Command[0] != "/usr/bin/model" {
			t.Errorf("stored project = %+v, %v; want env A=1 and the original command", got.Model, err)
		}
	}

	c := store.Call{ID: newCallID(), State: store.CallQueued, Inputs: []byte(`{"x":1}`)}
	if err := s.SaveCall(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	c.Inputs[2] = 'y'
	gc, err := s.GetCall(c.ID)
	if err != nil {
		t.Fatal(err)
	}
	gc.Inputs[2] = 'z'
	if gc, err := s.GetCall(c.ID); err != nil || string(gc.Inputs) != `{"x":1}` {
		t.Errorf("stored call inputs = %s, %v; want {\"x\":1}", gc.Inputs, err)
	}
}
