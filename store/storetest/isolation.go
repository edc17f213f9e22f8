package storetest

import (
	"context"
	"slices"
	"testing"

	"inferd/store"
)

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
