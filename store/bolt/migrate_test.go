package bolt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// Each schema version has a data file written by the inferd of that version,
// testdata/schema-v<N>.db, with the secret of its one API key beside it in
// schema-v<N>.secret. `go test ./store/bolt -run TestSchemaFixtures -update`
// writes the fixture of the current SchemaVersion when it is missing; commit
// it when you bump SchemaVersion, before changing the layout.
var update = flag.Bool("update", false, "write testdata/schema-v<SchemaVersion>.db if it is missing")

var fixtureTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const (
	fixtureCallDone    = "call_0194c3a0-0000-7000-8000-000000000001"
	fixtureCallPending = "call_0194c3a0-0000-7000-8000-000000000002"
)

func fixturePath(v int) string { return filepath.Join("testdata", fmt.Sprintf("schema-v%d.db", v)) }

// writeFixture fills a new data file with one of everything the store keeps
// and returns it as WriteBackup writes it (only the used pages: a few KiB).
func writeFixture(t *testing.T) (raw []byte, secret string) {
	t.Helper()
	s, err := Open(testPath(t), Options{Now: func() time.Time { return fixtureTime }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	secret, _, err = s.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutProject(testProject("echo", "acme")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []store.Call{
		{ID: fixtureCallDone, ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded, Inputs: json.RawMessage(`{"prompt":"hi"}`),
			Outputs: json.RawMessage(`{"echo":"hi"}`), Message: "success", Attempt: 1, Created: fixtureTime, Finished: fixtureTime.Add(time.Second)},
		{ID: fixtureCallPending, ProjectID: "echo", TeamID: "acme", State: store.CallQueued, Inputs: json.RawMessage(`{"n":1}`), Created: fixtureTime},
	} {
		if err := s.SaveCall(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := s.WriteBackup(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), secret
}

// checkFixtureData asserts that s holds what writeFixture wrote.
func checkFixtureData(t *testing.T, s *Store, secret string) {
	t.Helper()
	if k, err := s.Authenticate(secret); err != nil || k.TeamID != "acme" {
		t.Errorf("Authenticate(fixture secret) = %+v, %v; want a key of team acme", k, err)
	}
	if p, err := s.GetProject("echo"); err != nil || p.TeamID != "acme" || p.Model.KeyHash != store.HashModelKey("key-echo") {
		t.Errorf("GetProject(echo) = %+v, %v", p, err)
	}
	if p, err := s.ProjectByModelKey("key-echo"); err != nil || p.ID != "echo" {
		t.Errorf("ProjectByModelKey(key-echo) = %+v, %v", p, err)
	}
	if c, err := s.GetCall(fixtureCallDone); err != nil || c.State != store.CallSucceeded || string(c.Outputs) != `{"echo":"hi"}` {
		t.Errorf("GetCall(done) = %+v, %v", c, err)
	}
	if pending, err := s.PendingCalls(); err != nil || len(pending) != 1 || pending[0].ID != fixtureCallPending || pending[0].InputBytes != int64(len(`{"n":1}`)) {
		t.Errorf("PendingCalls() = %+v, %v; want the one queued call, its inputs' size", pending, err)
	}
	if in, err := s.CallInputs(fixtureCallPending); err != nil || string(in) != `{"n":1}` {
		t.Errorf("CallInputs(pending) = %s, %v", in, err)
	}
	if c, err := s.GetCallResult(fixtureCallDone); err != nil || string(c.Outputs) != `{"echo":"hi"}` || c.Inputs != nil {
		t.Errorf("GetCallResult(done) = %+v, %v", c, err)
	}
}

// copyFixture copies testdata/schema-v<v>.db into a temporary data dir.
func copyFixture(t *testing.T, v int) (path, secret string) {
	t.Helper()
	raw, err := os.ReadFile(fixturePath(v))
	if err != nil {
		t.Fatalf("schema version %d has no fixture (%v): run `go test ./store/bolt -run TestSchemaFixtures -update` with the inferd that writes version %d and commit %s",
			v, err, v, fixturePath(v))
	}
	sec, err := os.ReadFile(strings.TrimSuffix(fixturePath(v), ".db") + ".secret")
	if err != nil {
		t.Fatal(err)
	}
	path = testPath(t)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, strings.TrimSpace(string(sec))
}

func TestMigrationsEndAtSchemaVersion(t *testing.T) {
	if len(migrations) != SchemaVersion {
		t.Fatalf("%d migrations lead to schema version %d, but SchemaVersion is %d", len(migrations), len(migrations), SchemaVersion)
	}
}

// TestSchemaFixtures writes the current version's fixture on -update and
// checks that every version up to SchemaVersion has one.
func TestSchemaFixtures(t *testing.T) {
	if _, err := os.Stat(fixturePath(SchemaVersion)); errors.Is(err, os.ErrNotExist) && *update {
		raw, secret := writeFixture(t)
		if err := os.WriteFile(fixturePath(SchemaVersion), raw, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(strings.TrimSuffix(fixturePath(SchemaVersion), ".db")+".secret", []byte(secret+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for v := 1; v <= SchemaVersion; v++ {
		if _, err := os.Stat(fixturePath(v)); err != nil {
			t.Errorf("schema version %d has no fixture: run `go test ./store/bolt -run TestSchemaFixtures -update` and commit %s", v, fixturePath(v))
		}
	}
}

// TestOpenMigratesEveryOlderSchema opens each committed fixture with this
// binary: older versions are migrated (with a copy kept), the current one
// opens as is, and in every case all the data reads back.
func TestOpenMigratesEveryOlderSchema(t *testing.T) {
	for v := 1; v <= SchemaVersion; v++ {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			path, secret := copyFixture(t, v)
			s := openAt(t, path, Options{})
			m := s.Migration()
			want := Migration{From: v, To: SchemaVersion}
			if v < SchemaVersion {
				want.Copy = fmt.Sprintf("%s.schema-v%d", path, v)
			}
			if m != want {
				t.Errorf("Migration() = %+v, want %+v", m, want)
			}
			checkFixtureData(t, s, secret)
		})
	}
}

func TestNewFileStartsAtVersionZero(t *testing.T) {
	path := testPath(t)
	s := openAt(t, path, Options{})
	if m := s.Migration(); m != (Migration{From: 0, To: SchemaVersion}) || m.Migrated() {
		t.Errorf("a new file: Migration() = %+v (migrated %v), want from 0, no copy, not migrated", m, m.Migrated())
	}
	matches, _ := filepath.Glob(path + ".schema-*")
	if len(matches) != 0 {
		t.Errorf("a new file left copies %v", matches)
	}
}

// syntheticSteps are the real migrations plus two more: the first adds a
// field to every team record, the second a bucket, taking a file to
// SchemaVersion+2. calls records each step run ("label", "bucket").
func syntheticSteps(calls *[]string) []migration {
	steps := append([]migration(nil), migrations...)
	return append(steps,
		migration{why: "label teams", run: func(tx *bbolt.Tx) error {
			*calls = append(*calls, "label")
			b := tx.Bucket(bucketTeams)
			return b.ForEach(func(k, v []byte) error {
				var rec map[string]any
				if err := json.Unmarshal(v, &rec); err != nil {
					return err
				}
				rec["label"] = "migrated"
				out, err := json.Marshal(rec)
				if err != nil {
					return err
				}
				return b.Put(k, out)
			})
		}},
		migration{why: "add a bucket", run: func(tx *bbolt.Tx) error {
			*calls = append(*calls, "bucket")
			_, err := tx.CreateBucket([]byte("v3things"))
			return err
		}},
	)
}

func TestOpenRunsEachStepOnceAndKeepsACopy(t *testing.T) {
	path, secret := copyFixture(t, 1)
	var ran []string
	s, err := Open(path, Options{migrations: syntheticSteps(&ran)})
	if err != nil {
		t.Fatal(err)
	}
	top := SchemaVersion + 2
	want := Migration{From: 1, To: top, Copy: path + ".schema-v1"}
	if m := s.Migration(); m != want || !m.Migrated() {
		t.Errorf("Migration() = %+v, want %+v", m, want)
	}
	if strings.Join(ran, ",") != "label,bucket" {
		t.Errorf("steps ran: %v, want label,bucket", ran)
	}
	err = s.view(func(tx *bbolt.Tx) error {
		if got := string(tx.Bucket(bucketMeta).Get(keySchema)); got != strconv.Itoa(top) {
			t.Errorf("recorded schema = %q, want %d", got, top)
		}
		if tx.Bucket([]byte("v3things")) == nil {
			t.Error("the bucket step did not take effect")
		}
		if team := tx.Bucket(bucketTeams).Get([]byte("acme")); !bytes.Contains(team, []byte(`"label":"migrated"`)) {
			t.Errorf("the label step did not take effect: team = %s", team)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkFixtureData(t, s, secret)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopening runs nothing more.
	ran = nil
	s = openAt(t, path, Options{migrations: syntheticSteps(&ran)})
	if m := s.Migration(); len(ran) != 0 || m != (Migration{From: top, To: top}) {
		t.Errorf("reopen: steps %v, Migration() = %+v; want none, %d→%d", ran, m, top, top)
	}
	s.Close()

	// This binary refuses the migrated file, and the copy is the version 1
	// data it can still serve.
	_, err = Open(path, Options{})
	if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), fmt.Sprintf("schema version %d, newer than version %d", top, SchemaVersion)) {
		t.Errorf("open a newer schema: %v, want ErrSchema naming both versions", err)
	}
	old := openAt(t, want.Copy, Options{})
	if m := old.Migration(); m.From != 1 {
		t.Errorf("the copy has schema %d, want 1", m.From)
	}
	checkFixtureData(t, old, secret)
}

func TestFailedStepLeavesTheFileUnchanged(t *testing.T) {
	path, secret := copyFixture(t, 1)
	var ran []string
	steps := syntheticSteps(&ran)
	steps[len(steps)-1].run = func(*bbolt.Tx) error { return errors.New("disk says no") }
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(path, Options{migrations: steps})
	if want := fmt.Sprintf("from schema version %d to %d (add a bucket): disk says no", SchemaVersion+1, SchemaVersion+2); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open with a failing step: %v, want an error naming the step", err)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("a failed migration changed the data file")
	}
	s := openAt(t, path, Options{})
	if m := s.Migration(); m.From != 1 {
		t.Errorf("after a failed migration the file has schema %d, want 1", m.From)
	}
	checkFixtureData(t, s, secret)
}

func TestReadOnlyOpenChangesNothing(t *testing.T) {
	path, secret := copyFixture(t, 1)
	var ran []string
	before, _ := os.ReadFile(path)
	s, err := Open(path, Options{ReadOnly: true, migrations: syntheticSteps(&ran)})
	if err != nil {
		t.Fatal(err)
	}
	if m := s.Migration(); len(ran) != 0 || m != (Migration{From: 1, To: 1}) {
		t.Errorf("read-only open of an older schema: steps %v, Migration() = %+v; want none, 1→1", ran, m)
	}
	checkFixtureData(t, s, secret)
	if _, err := s.EnsureTeam("new"); err == nil {
		t.Error("a read-only store accepted a write")
	}
	s.Close()
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("a read-only open changed the file")
	}
	if matches, _ := filepath.Glob(path + ".schema-*"); len(matches) != 0 {
		t.Errorf("a read-only open wrote copies %v", matches)
	}

	// A file that is missing, empty or held by a writer is refused.
	if _, err := Open(filepath.Join(t.TempDir(), "missing.db"), Options{ReadOnly: true}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("read-only open of a missing file: %v, want ErrNotExist", err)
	}
	empty := testPath(t)
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(empty, Options{ReadOnly: true}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("read-only open of an empty file: %v, want ErrCorrupt", err)
	}
	openAt(t, path, Options{})
	if _, err := Open(path, Options{ReadOnly: true, Timeout: 100 * time.Millisecond}); !errors.Is(err, ErrInUse) {
		t.Errorf("read-only open while a writer holds the file: %v, want ErrInUse", err)
	}
}
