package storetest

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/store"
)

// ProjectByModelKey answers from a cache after the first lookup; every
// project write must show at once, and callers must not share its copy.
func testProjectByModelKeySeesEveryWriteAtOnce(t *testing.T, e *env) {
	s := e.open(t)
	p := Project("p", "t")
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
	got, err := s.ProjectByModelKey("key-p") // now cached
	if err != nil {
		t.Fatal(err)
	}
	got.Model.Command[0] = "/changed/by/caller"

	if _, err := s.UpdateProject("p", func(p *store.Project) error { p.MaxReplicas = 7; return nil }); err != nil {
		t.Fatal(err)
	}
	got, err = s.ProjectByModelKey("key-p")
	if err != nil || got.MaxReplicas != 7 || got.Model.Command[0] != "/usr/bin/model" {
		t.Fatalf("after UpdateProject: max %d command %q, %v", got.MaxReplicas, got.Model.Command, err)
	}

	p.MaxReplicas = 9
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ProjectByModelKey("key-p"); err != nil || got.MaxReplicas != 9 {
		t.Fatalf("after PutProject: max %d, %v", got.MaxReplicas, err)
	}

	if err := s.DeleteProject("p"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ProjectByModelKey("key-p"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after DeleteProject: %v, want ErrNotFound", err)
	}
}

func testPutProjectReportsCreatedUpdatedUnchanged(t *testing.T, e *env) {
	clock := e.clock
	s := e.open(t)
	p := Project("p", "team-a")
	created0 := clock.Now()
	steps := []struct {
		name string
		edit func(*store.Project)
		want store.Change
	}{
		{"create", func(*store.Project) {}, store.ChangeCreated},
		{"same again", func(*store.Project) {}, store.ChangeUnchanged},
		{"only stamps differ", func(p *store.Project) { p.Created = time.Unix(1, 0); p.Updated = time.Unix(2, 0) }, store.ChangeUnchanged},
		{"max changes", func(p *store.Project) { p.MaxReplicas = 5 }, store.ChangeUpdated},
		{"env added", func(p *store.Project) { p.Model.Env = map[string]string{"A": "1"} }, store.ChangeUpdated},
		{"env same", func(*store.Project) {}, store.ChangeUnchanged},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clock.Advance(time.Minute)
			st.edit(&p)
			got, err := s.PutProject(p)
			if err != nil {
				t.Fatal(err)
			}
			if got != st.want {
				t.Errorf("PutProject = %s, want %s", got, st.want)
			}
			stored, err := s.GetProject("p")
			if err != nil {
				t.Fatal(err)
			}
			if !stored.Created.Equal(created0.Add(time.Minute)) {
				t.Errorf("Created = %v, want the first write's time", stored.Created)
			}
			if st.want != store.ChangeUnchanged && !stored.Updated.Equal(clock.Now()) {
				t.Errorf("Updated = %v, want %v", stored.Updated, clock.Now())
			}
		})
	}
}

func testPutProjectRejectsInvalidAndCreatesTeam(t *testing.T, e *env) {
	s := e.open(t)
	bad := Project("p", "team-a")
	bad.MaxReplicas = 0
	var ve *store.ValidationError
	if _, err := s.PutProject(bad); !errors.As(err, &ve) || ve.Field != "maxReplicas" {
		t.Errorf("PutProject(invalid) = %v", err)
	}
	if _, err := s.PutProject(Project("p", "team-a")); err != nil {
		t.Fatal(err)
	}
	if teams, _ := s.ListTeams(); len(teams) != 1 || teams[0].ID != "team-a" {
		t.Errorf("teams = %+v, want team-a", teams)
	}
}

func testPutProjectModelKeyConflict(t *testing.T, e *env) {
	s := e.open(t)
	if _, err := s.PutProject(Project("one", "t")); err != nil {
		t.Fatal(err)
	}
	two := Project("two", "t")
	two.Model.KeyHash = store.HashModelKey("key-one")
	_, err := s.PutProject(two)
	if !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "one") {
		t.Errorf("PutProject(conflicting key) = %v, want ErrConflict naming project one", err)
	}
	if _, err := s.GetProject("two"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("conflicting project was stored: %v", err)
	}
	if p, err := s.ProjectByModelKey("key-one"); err != nil || p.ID != "one" {
		t.Errorf("ProjectByModelKey(key-one) = %s, %v", p.ID, err)
	}
}

func testPutProjectsIsAllOrNothing(t *testing.T, e *env) {
	s := e.open(t)
	if _, err := s.PutProject(Project("one", "t")); err != nil {
		t.Fatal(err)
	}
	var changed []string
	s.OnProjectChange(func(id string) { changed = append(changed, id) })
	clash := Project("clash", "t")
	clash.Model.KeyHash = store.HashModelKey("key-one")
	if _, err := s.PutProjects([]store.Project{Project("fresh", "new-team"), clash}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("PutProjects(fresh, clash) = %v, want ErrConflict", err)
	}
	if _, err := s.GetProject("fresh"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("fresh was stored beside a conflicting project: %v", err)
	}
	if teams, _ := s.ListTeams(); len(teams) != 1 {
		t.Errorf("teams = %+v, want only t", teams)
	}
	if len(changed) != 0 {
		t.Errorf("change hooks ran for %v after a failed write", changed)
	}

	changes, err := s.PutProjects([]store.Project{Project("one", "t"), Project("fresh", "new-team")})
	if err != nil || len(changes) != 2 || changes[0] != store.ChangeUnchanged || changes[1] != store.ChangeCreated {
		t.Fatalf("PutProjects = %v, %v; want [unchanged created]", changes, err)
	}
	if len(changed) != 1 || changed[0] != "fresh" {
		t.Errorf("change hooks ran for %v, want [fresh]", changed)
	}
}

func testPutProjectMovesModelKeyIndex(t *testing.T, e *env) {
	s := e.open(t)
	p := Project("p", "t")
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
	p.Model.KeyHash = store.HashModelKey("new-key")
	if c, err := s.PutProject(p); err != nil || c != store.ChangeUpdated {
		t.Fatalf("PutProject = %s, %v", c, err)
	}
	for _, tc := range []struct {
		name, key string
		found     bool
	}{
		{"old key gone", "key-p", false},
		{"new key found", "new-key", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ProjectByModelKey(tc.key)
			if tc.found && (err != nil || got.ID != "p") {
				t.Errorf("ProjectByModelKey = %s, %v; want p", got.ID, err)
			}
			if !tc.found && !errors.Is(err, store.ErrNotFound) {
				t.Errorf("ProjectByModelKey = %s, %v; want ErrNotFound", got.ID, err)
			}
		})
	}
	// The freed key can now go to another project.
	q := Project("q", "t")
	q.Model.KeyHash = store.HashModelKey("key-p")
	if _, err := s.PutProject(q); err != nil {
		t.Errorf("PutProject with the freed key = %v", err)
	}
}

func testUpdateProject(t *testing.T, e *env) {
	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		fn      func(*store.Project) error
		wantErr func(error) bool
		wantMax int
	}{
		{"applies change", func(p *store.Project) error { p.MaxReplicas = 7; return nil }, nil, 7},
		{"fn error aborts unwrapped", func(p *store.Project) error { p.MaxReplicas = 7; return errBoom },
			func(err error) bool { return err == errBoom }, 3},
		{"invalid result aborts", func(p *store.Project) error { p.MinReplicas = 9; return nil },
			func(err error) bool { ve, ok := err.(*store.ValidationError); return ok && ve.Field == "minReplicas" }, 3},
		{"id change refused", func(p *store.Project) error { p.ID = "other"; return nil },
			func(err error) bool { ve, ok := err.(*store.ValidationError); return ok && ve.Field == "id" }, 3},
		{"env edit in fn aborted", func(p *store.Project) error { p.Model.Env["A"] = "2"; return errBoom },
			func(err error) bool { return err == errBoom }, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := e.open(t)
			p := Project("p", "t")
			p.Model.Env = map[string]string{"A": "1"}
			if _, err := s.PutProject(p); err != nil {
				t.Fatal(err)
			}
			got, err := s.UpdateProject("p", tc.fn)
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Fatalf("UpdateProject error = %v", err)
				}
			} else if err != nil || got.MaxReplicas != tc.wantMax {
				t.Fatalf("UpdateProject = %+v, %v", got, err)
			}
			stored, err := s.GetProject("p")
			if err != nil {
				t.Fatal(err)
			}
			if stored.MaxReplicas != tc.wantMax || stored.MinReplicas != p.MinReplicas || stored.Model.Env["A"] != "1" {
				t.Errorf("stored min = %d max = %d env = %v, want min %d max %d env A=1",
					stored.MinReplicas, stored.MaxReplicas, stored.Model.Env, p.MinReplicas, tc.wantMax)
			}
		})
	}
	t.Run("unknown project", func(t *testing.T) {
		s := e.open(t)
		_, err := s.UpdateProject("nope", func(*store.Project) error { return nil })
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("UpdateProject(unknown) = %v, want ErrNotFound", err)
		}
	})
}

func testUpdateProjectConcurrentIncrementsAllApply(t *testing.T, e *env) {
	s := e.open(t)
	p := Project("p", "t")
	p.MaxReplicas = 1
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := s.UpdateProject("p", func(p *store.Project) error { p.MaxReplicas++; return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got, _ := s.GetProject("p"); got.MaxReplicas != 21 {
		t.Errorf("MaxReplicas = %d, want 21", got.MaxReplicas)
	}
}

func testOnProjectChangeFiresAfterCommit(t *testing.T, e *env) {
	s := e.open(t)
	type event struct {
		hook int
		id   string
		max  int // what a read inside the hook sees: proves the commit came first
	}
	var events []event
	for i := range 2 {
		s.OnProjectChange(func(id string) {
			p, err := s.GetProject(id) // would deadlock if a transaction were held
			if err != nil {
				p.MaxReplicas = -1 // deleted
			}
			events = append(events, event{i, id, p.MaxReplicas})
		})
	}
	p := Project("p", "t")
	steps := []func() error{
		func() error { _, err := s.PutProject(p); return err },
		func() error { _, err := s.PutProject(p); return err }, // unchanged: no event
		func() error {
			_, err := s.UpdateProject("p", func(p *store.Project) error { p.MaxReplicas = 9; return nil })
			return err
		},
		func() error { _, err := s.UpdateProject("p", func(*store.Project) error { return nil }); return err }, // unchanged
		func() error { // aborted: no event
			if _, err := s.UpdateProject("p", func(*store.Project) error { return errors.New("no") }); err == nil {
				return errors.New("aborting update succeeded")
			}
			return nil
		},
		func() error { return s.DeleteProject("p") },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	want := []event{{0, "p", 3}, {1, "p", 3}, {0, "p", 9}, {1, "p", 9}, {0, "p", -1}, {1, "p", -1}}
	if !slices.Equal(events, want) {
		t.Errorf("events = %v, want %v", events, want)
	}
}

func testDeleteAndListProjects(t *testing.T, e *env) {
	s := e.open(t)
	for _, p := range []store.Project{Project("c", "t1"), Project("a", "t2"), Project("b", "t1")} {
		if _, err := s.PutProject(p); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(team string) []string {
		ps, err := s.ListProjects(team)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range ps {
			out = append(out, p.ID)
		}
		return out
	}
	if got := ids(""); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("ListProjects(all) = %v", got)
	}
	if got := ids("t1"); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("ListProjects(t1) = %v", got)
	}
	if err := s.DeleteProject("b"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteProject("b"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second DeleteProject = %v, want ErrNotFound", err)
	}
	if _, err := s.ProjectByModelKey("key-b"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ProjectByModelKey after delete = %v, want ErrNotFound", err)
	}
	if got := ids("t1"); !slices.Equal(got, []string{"c"}) {
		t.Errorf("ListProjects(t1) after delete = %v", got)
	}
}

// testReapplyKeepsWhatTheManifestDidNotChange: an apply (a declared
// project) keeps what the project API changed where the manifest did not
// change since its last apply, takes what it did change, and refuses, with
// nothing written, a merge that is no valid project.
func testReapplyKeepsWhatTheManifestDidNotChange(t *testing.T, e *env) {
	s := e.open(t)
	declared := Project("p", "t")
	// Stored before declarations were kept: the first apply of the same
	// content reports it unchanged, and records the declaration.
	if _, err := s.PutProject(declared); err != nil {
		t.Fatal(err)
	}
	if changes, err := s.PutProjects([]store.Project{declared.Declared()}); err != nil || changes[0] != store.ChangeUnchanged {
		t.Fatalf("first apply over a project stored without a declaration = %v, %v; want unchanged", changes, err)
	}
	if _, err := s.UpdateProject("p", func(p *store.Project) error { p.IdleTimeout, p.MaxReplicas = 600, 2; return nil }); err != nil {
		t.Fatal(err)
	}
	changes, err := s.PutProjects([]store.Project{declared.Declared()})
	if err != nil || changes[0] != store.ChangeUnchanged {
		t.Fatalf("re-apply of the same manifest = %v, %v; want unchanged", changes, err)
	}
	declared.InferenceTimeout = 60 // the manifest changes one field
	if changes, err = s.PutProjects([]store.Project{declared.Declared()}); err != nil || changes[0] != store.ChangeUpdated {
		t.Fatalf("apply of a changed manifest = %v, %v; want updated", changes, err)
	}
	got, err := s.GetProject("p")
	if err != nil {
		t.Fatal(err)
	}
	if got.IdleTimeout != 600 || got.MaxReplicas != 2 || got.InferenceTimeout != 60 {
		t.Errorf("after re-apply: idleTimeout %d maxReplicas %d inferenceTimeout %d, want 600 2 60 (the project API's values kept, the manifest's change taken)",
			got.IdleTimeout, got.MaxReplicas, got.InferenceTimeout)
	}
	declared.MinReplicas = 3 // above the maxReplicas 2 the project API set
	if _, err := s.PutProjects([]store.Project{declared.Declared()}); err == nil {
		t.Fatal("apply of minReplicas 3 over a kept maxReplicas 2 succeeded")
	}
	if after, _ := s.GetProject("p"); after.MinReplicas != 0 {
		t.Errorf("a refused apply wrote minReplicas %d", after.MinReplicas)
	}
	declared.MinReplicas, declared.MaxReplicas = 3, 4 // both changed by the manifest
	if _, err := s.PutProjects([]store.Project{declared.Declared()}); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.GetProject("p"); got.MinReplicas != 3 || got.MaxReplicas != 4 || got.IdleTimeout != 600 {
		t.Errorf("after apply: %+v, want minReplicas 3, maxReplicas 4, idleTimeout 600", got)
	}
}
