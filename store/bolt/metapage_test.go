package bolt

import (
	"fmt"
	"os"
	"testing"

	bbolt "go.etcd.io/bbolt"
)

// TestOpenSurvivesATornFirstMetaPageAtAnyPageSize: bbolt keeps two meta
// pages so that a meta write torn by a power cut leaves the other one to
// open from. A file's page size is the OS page size where it was created:
// 16 or 64 KiB on some arm64 kernels (Grace Hopper boxes among them). Open
// must accept such a file with page 0 torn, as bbolt itself does, instead of
// calling it corrupt and telling the operator to restore a backup.
func TestOpenSurvivesATornFirstMetaPageAtAnyPageSize(t *testing.T) {
	for _, pageSize := range []int{4096, 16384, 65536} {
		t.Run(fmt.Sprint(pageSize), func(t *testing.T) {
			path := testPath(t)
			db, err := bbolt.Open(path, 0o600, &bbolt.Options{PageSize: pageSize})
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.EnsureTeam("acme"); err != nil {
				t.Fatal(err)
			}
			// A second commit, so both meta pages point at a tree that
			// holds the team.
			if _, err := s.EnsureTeam("other"); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			// Tear meta page 0: garble its checksummed fields.
			if _, err := f.WriteAt([]byte("torn write"), boltPageHeader+16); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}

			s, err = Open(path, Options{})
			if err != nil {
				t.Fatalf("Open after a torn meta page 0: %v", err)
			}
			defer s.Close()
			teams, err := s.ListTeams()
			if err != nil || len(teams) == 0 || teams[0].ID != "acme" {
				t.Errorf("teams = %+v, %v; want acme kept", teams, err)
			}
		})
	}
}
