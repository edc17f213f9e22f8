package store

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNewProjectDefaults(t *testing.T) {
	p := NewProject("p", "t")
	want := Project{ID: "p", TeamID: "t", MinReplicas: 0, MaxReplicas: 3, InferenceTimeout: 300, IdleTimeout: 30,
		Model: ModelSpec{Protocol: "http", HealthPath: "/healthz", InferPath: "/", Concurrency: 1, BootTimeout: 600}}
	if !sameProject(p, want) {
		t.Errorf("NewProject = %+v, want %+v", p, want)
	}
	var q Project
	q.Model.Protocol = ProtocolPotassium
	q.ApplyDefaults()
	if q.Model.HealthPath != "/__status__" {
		t.Errorf("potassium health path = %q", q.Model.HealthPath)
	}
}

func TestProjectValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(*Project)
		field  string // "" = valid
		reason string
	}{
		{"defaults are valid", func(*Project) {}, "", ""},
		{"id empty", func(p *Project) { p.ID = "" }, "id", ""},
		{"id 64 chars", func(p *Project) { p.ID = strings.Repeat("a", 64) }, "", ""},
		{"id 65 chars", func(p *Project) { p.ID = strings.Repeat("a", 65) }, "id", ""},
		{"id uppercase", func(p *Project) { p.ID = "Abc" }, "id", ""},
		{"id underscore", func(p *Project) { p.ID = "a_b" }, "id", ""},
		{"id dashes digits", func(p *Project) { p.ID = "a-1-b" }, "", ""},
		{"teamId empty", func(p *Project) { p.TeamID = "" }, "teamId", ""},
		{"teamId slash", func(p *Project) { p.TeamID = "a/b" }, "teamId", ""},
		{"minReplicas -1", func(p *Project) { p.MinReplicas = -1 }, "minReplicas", "must be at least 0"},
		{"minReplicas equals max", func(p *Project) { p.MinReplicas = 3 }, "", ""},
		{"minReplicas above max", func(p *Project) { p.MinReplicas = 4 }, "minReplicas", "must not exceed maxReplicas (3)"},
		{"maxReplicas 0", func(p *Project) { p.MaxReplicas = 0 }, "maxReplicas", "must be at least 1"},
		{"maxReplicas 1000", func(p *Project) { p.MaxReplicas = 1000 }, "", ""},
		{"maxReplicas 1001", func(p *Project) { p.MaxReplicas = 1001 }, "maxReplicas", "must be at most 1000"},
		{"min and max 1000", func(p *Project) { p.MinReplicas, p.MaxReplicas = 1000, 1000 }, "", ""},
		{"inferenceTimeout 0", func(p *Project) { p.InferenceTimeout = 0 }, "inferenceTimeout", ""},
		{"inferenceTimeout 1", func(p *Project) { p.InferenceTimeout = 1 }, "", ""},
		{"inferenceTimeout 86400", func(p *Project) { p.InferenceTimeout = 86400 }, "", ""},
		{"inferenceTimeout 86401", func(p *Project) { p.InferenceTimeout = 86401 }, "inferenceTimeout", ""},
		{"idleTimeout -1", func(p *Project) { p.IdleTimeout = -1 }, "idleTimeout", ""},
		{"idleTimeout 0", func(p *Project) { p.IdleTimeout = 0 }, "", ""},
		{"idleTimeout 86400", func(p *Project) { p.IdleTimeout = 86400 }, "", ""},
		{"idleTimeout 86401", func(p *Project) { p.IdleTimeout = 86401 }, "idleTimeout", ""},
		{"command nil", func(p *Project) { p.Model.Command = nil }, "model.command", "must not be empty"},
		{"command empty string", func(p *Project) { p.Model.Command = []string{""} }, "model.command", ""},
		{"protocol empty", func(p *Project) { p.Model.Protocol = "" }, "model.protocol", ""},
		{"protocol potassium", func(p *Project) { p.Model.Protocol = "potassium" }, "", ""},
		{"protocol grpc", func(p *Project) { p.Model.Protocol = "grpc" }, "model.protocol", ""},
		{"gpus -1", func(p *Project) { p.Model.GPUs = -1 }, "model.gpus", ""},
		{"gpus 64", func(p *Project) { p.Model.GPUs = 64 }, "", ""},
		{"gpus 65", func(p *Project) { p.Model.GPUs = 65 }, "model.gpus", ""},
		{"gpuMemoryMiB -1", func(p *Project) { p.Model.GPUMemoryMiB = -1 }, "model.gpuMemoryMiB", ""},
		{"gpuMemoryMiB 0", func(p *Project) { p.Model.GPUMemoryMiB = 0 }, "", ""},
		{"concurrency 0", func(p *Project) { p.Model.Concurrency = 0 }, "model.concurrency", ""},
		{"concurrency 1000", func(p *Project) { p.Model.Concurrency = 1000 }, "", ""},
		{"concurrency 1001", func(p *Project) { p.Model.Concurrency = 1001 }, "model.concurrency", ""},
		{"potassium concurrency 1", func(p *Project) { p.Model.Protocol = ProtocolPotassium }, "", ""},
		{"potassium concurrency 2", func(p *Project) { p.Model.Protocol = ProtocolPotassium; p.Model.Concurrency = 2 }, "model.concurrency",
			`must be 1 for protocol "potassium": a Potassium app runs one call at a time on its single worker (raise maxReplicas to serve more at once)`},
		{"bootTimeout 0", func(p *Project) { p.Model.BootTimeout = 0 }, "model.bootTimeout", ""},
		{"bootTimeout 86400", func(p *Project) { p.Model.BootTimeout = 86400 }, "", ""},
		{"bootTimeout 86401", func(p *Project) { p.Model.BootTimeout = 86401 }, "model.bootTimeout", ""},
		{"keyHash empty", func(p *Project) { p.Model.KeyHash = "" }, "model.keyHash", ""},
		{"keyHash short", func(p *Project) { p.Model.KeyHash = p.Model.KeyHash[:63] }, "model.keyHash", ""},
		{"keyHash uppercase", func(p *Project) { p.Model.KeyHash = strings.ToUpper(p.Model.KeyHash) }, "model.keyHash", ""},
		{"keyHash not hex", func(p *Project) { p.Model.KeyHash = strings.Repeat("g", 64) }, "model.keyHash", ""},
		{"dir relative", func(p *Project) { p.Model.Dir = "models/a" }, "model.dir", ""},
		{"dir absolute", func(p *Project) { p.Model.Dir = "/srv/models/a" }, "", ""},
		{"healthPath relative", func(p *Project) { p.Model.HealthPath = "healthz" }, "model.healthPath", ""},
		{"inferPath relative", func(p *Project) { p.Model.InferPath = "infer" }, "model.inferPath", ""},
		{"env name with =", func(p *Project) { p.Model.Env = map[string]string{"A=B": "c"} }, "model.env", ""},
		{"env ok", func(p *Project) { p.Model.Env = map[string]string{"HF_HOME": "/x"} }, "", ""},
		{"env value with NUL", func(p *Project) { p.Model.Env = map[string]string{"A": "b\x00c"} }, "model.env", ""},
		{"command arg with NUL", func(p *Project) { p.Model.Command = []string{"/bin/model", "--x\x00"} }, "model.command", ""},
		{"dir with NUL", func(p *Project) { p.Model.Dir = "/srv/\x00" }, "model.dir", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testProject("p", "t")
			tc.edit(&p)
			err := p.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate = %v, want *ValidationError", err)
			}
			if ve.Field != tc.field {
				t.Errorf("field = %q, want %q (%v)", ve.Field, tc.field, err)
			}
			if tc.reason != "" && ve.Reason != tc.reason {
				t.Errorf("reason = %q, want %q", ve.Reason, tc.reason)
			}
			if !strings.HasPrefix(err.Error(), tc.field+": ") {
				t.Errorf("Error() = %q, want it to start with %q", err, tc.field+": ")
			}
		})
	}
}

func TestPutProjectReportsCreatedUpdatedUnchanged(t *testing.T) {
	clock := newFakeClock()
	s := openAt(t, testPath(t), Options{Now: clock.Now})
	p := testProject("p", "team-a")
	created0 := clock.Now()
	steps := []struct {
		name string
		edit func(*Project)
		want Change
	}{
		{"create", func(*Project) {}, ChangeCreated},
		{"same again", func(*Project) {}, ChangeUnchanged},
		{"only stamps differ", func(p *Project) { p.Created = time.Unix(1, 0); p.Updated = time.Unix(2, 0) }, ChangeUnchanged},
		{"max changes", func(p *Project) { p.MaxReplicas = 5 }, ChangeUpdated},
		{"env added", func(p *Project) { p.Model.Env = map[string]string{"A": "1"} }, ChangeUpdated},
		{"env same", func(*Project) {}, ChangeUnchanged},
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
			if st.want != ChangeUnchanged && !stored.Updated.Equal(clock.Now()) {
				t.Errorf("Updated = %v, want %v", stored.Updated, clock.Now())
			}
		})
	}
}

func TestPutProjectRejectsInvalidAndCreatesTeam(t *testing.T) {
	s := openTest(t)
	bad := testProject("p", "team-a")
	bad.MaxReplicas = 0
	var ve *ValidationError
	if _, err := s.PutProject(bad); !errors.As(err, &ve) || ve.Field != "maxReplicas" {
		t.Errorf("PutProject(invalid) = %v", err)
	}
	if _, err := s.PutProject(testProject("p", "team-a")); err != nil {
		t.Fatal(err)
	}
	if teams, _ := s.ListTeams(); len(teams) != 1 || teams[0].ID != "team-a" {
		t.Errorf("teams = %+v, want team-a", teams)
	}
}

func TestPutProjectModelKeyConflict(t *testing.T) {
	s := openTest(t)
	if _, err := s.PutProject(testProject("one", "t")); err != nil {
		t.Fatal(err)
	}
	two := testProject("two", "t")
	two.Model.KeyHash = HashModelKey("key-one")
	_, err := s.PutProject(two)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "one") {
		t.Errorf("PutProject(conflicting key) = %v, want ErrConflict naming project one", err)
	}
	if _, err := s.GetProject("two"); !errors.Is(err, ErrNotFound) {
		t.Errorf("conflicting project was stored: %v", err)
	}
	if p, err := s.ProjectByModelKey("key-one"); err != nil || p.ID != "one" {
		t.Errorf("ProjectByModelKey(key-one) = %s, %v", p.ID, err)
	}
}

func TestPutProjectsIsAllOrNothing(t *testing.T) {
	s := openTest(t)
	if _, err := s.PutProject(testProject("one", "t")); err != nil {
		t.Fatal(err)
	}
	var changed []string
	s.OnProjectChange(func(id string) { changed = append(changed, id) })
	clash := testProject("clash", "t")
	clash.Model.KeyHash = HashModelKey("key-one")
	if _, err := s.PutProjects([]Project{testProject("fresh", "new-team"), clash}); !errors.Is(err, ErrConflict) {
		t.Fatalf("PutProjects(fresh, clash) = %v, want ErrConflict", err)
	}
	if _, err := s.GetProject("fresh"); !errors.Is(err, ErrNotFound) {
		t.Errorf("fresh was stored beside a conflicting project: %v", err)
	}
	if teams, _ := s.ListTeams(); len(teams) != 1 {
		t.Errorf("teams = %+v, want only t", teams)
	}
	if len(changed) != 0 {
		t.Errorf("change hooks ran for %v after a failed write", changed)
	}

	changes, err := s.PutProjects([]Project{testProject("one", "t"), testProject("fresh", "new-team")})
	if err != nil || len(changes) != 2 || changes[0] != ChangeUnchanged || changes[1] != ChangeCreated {
		t.Fatalf("PutProjects = %v, %v; want [unchanged created]", changes, err)
	}
	if len(changed) != 1 || changed[0] != "fresh" {
		t.Errorf("change hooks ran for %v, want [fresh]", changed)
	}
}

func TestPutProjectMovesModelKeyIndex(t *testing.T) {
	s := openTest(t)
	p := testProject("p", "t")
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
	p.Model.KeyHash = HashModelKey("new-key")
	if c, err := s.PutProject(p); err != nil || c != ChangeUpdated {
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
			if !tc.found && !errors.Is(err, ErrNotFound) {
				t.Errorf("ProjectByModelKey = %s, %v; want ErrNotFound", got.ID, err)
			}
		})
	}
	// The freed key can now go to another project.
	q := testProject("q", "t")
	q.Model.KeyHash = HashModelKey("key-p")
	if _, err := s.PutProject(q); err != nil {
		t.Errorf("PutProject with the freed key = %v", err)
	}
}

func TestUpdateProject(t *testing.T) {
	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		fn      func(*Project) error
		wantErr func(error) bool
		wantMax int
	}{
		{"applies change", func(p *Project) error { p.MaxReplicas = 7; return nil }, nil, 7},
		{"fn error aborts unwrapped", func(p *Project) error { p.MaxReplicas = 7; return errBoom },
			func(err error) bool { return err == errBoom }, 3},
		{"invalid result aborts", func(p *Project) error { p.MinReplicas = 9; return nil },
			func(err error) bool { ve, ok := err.(*ValidationError); return ok && ve.Field == "minReplicas" }, 3},
		{"id change refused", func(p *Project) error { p.ID = "other"; return nil },
			func(err error) bool { ve, ok := err.(*ValidationError); return ok && ve.Field == "id" }, 3},
		{"env edit in fn aborted", func(p *Project) error { p.Model.Env["A"] = "2"; return errBoom },
			func(err error) bool { return err == errBoom }, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openTest(t)
			p := testProject("p", "t")
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
		s := openTest(t)
		_, err := s.UpdateProject("nope", func(*Project) error { return nil })
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("UpdateProject(unknown) = %v, want ErrNotFound", err)
		}
	})
}

func TestUpdateProjectConcurrentIncrementsAllApply(t *testing.T) {
	s := openTest(t)
	p := testProject("p", "t")
	p.MaxReplicas = 1
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := s.UpdateProject("p", func(p *Project) error { p.MaxReplicas++; return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got, _ := s.GetProject("p"); got.MaxReplicas != 21 {
		t.Errorf("MaxReplicas = %d, want 21", got.MaxReplicas)
	}
}

func TestOnProjectChangeFiresAfterCommit(t *testing.T) {
	s := openTest(t)
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
	p := testProject("p", "t")
	steps := []func() error{
		func() error { _, err := s.PutProject(p); return err },
		func() error { _, err := s.PutProject(p); return err }, // unchanged: no event
		func() error {
			_, err := s.UpdateProject("p", func(p *Project) error { p.MaxReplicas = 9; return nil })
			return err
		},
		func() error { _, err := s.UpdateProject("p", func(*Project) error { return nil }); return err }, // unchanged
		func() error { // aborted: no event
			if _, err := s.UpdateProject("p", func(*Project) error { return errors.New("no") }); err == nil {
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

func TestDeleteAndListProjects(t *testing.T) {
	s := openTest(t)
	for _, p := range []Project{testProject("c", "t1"), testProject("a", "t2"), testProject("b", "t1")} {
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
	if err := s.DeleteProject("b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second DeleteProject = %v, want ErrNotFound", err)
	}
	if _, err := s.ProjectByModelKey("key-b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ProjectByModelKey after delete = %v, want ErrNotFound", err)
	}
	if got := ids("t1"); !slices.Equal(got, []string{"c"}) {
		t.Errorf("ListProjects(t1) after delete = %v", got)
	}
}
