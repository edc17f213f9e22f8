package bolt

import (
	"errors"
	"testing"

	"inferd/store"
)

// ProjectByModelKey answers from a cache after the first lookup; every
// project write must show at once, and callers must not share its copy.
func TestProjectByModelKeySeesEveryWriteAtOnce(t *testing.T) {
	s := openTest(t)
	p := testProject("p", "t")
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

func BenchmarkProjectByModelKey(b *testing.B) {
	s := openTest(b)
	if _, err := s.PutProject(testProject("p", "t")); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ProjectByModelKey("key-p"); err != nil {
			b.Fatal(err)
		}
	}
}
