package bolt

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
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

func TestOpenCreatesPrivateFileAndDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "inferd.db")
	s := openAt(t, path, Options{})
	if s.Path() != path {
		t.Errorf("Path() = %q, want %q", s.Path(), path)
	}
	if s.Size() <= 0 {
		t.Errorf("Size() = %d, want > 0", s.Size())
	}
	for _, tc := range []struct {
		name string
		path string
		mode os.FileMode
	}{
		{"directory", dir, 0o700},
		{"file", path, 0o600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fi, err := os.Stat(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != tc.mode {
				t.Errorf("mode = %v, want %v", got, tc.mode)
			}
		})
	}
}

// setSchema rewrites the schema version of a closed data file with raw bbolt.
func setSchema(t *testing.T, path, version string) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(version))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesUnknownSchema(t *testing.T) {
	for _, tc := range []struct {
		name    string
		version string
		want    []string
	}{
		{"newer", strconv.Itoa(SchemaVersion + 1), []string{fmt.Sprintf("schema version %d", SchemaVersion+1), fmt.Sprintf("version %d", SchemaVersion), "upgrade inferd"}},
		{"much newer", "17", []string{"schema version 17", fmt.Sprintf("version %d", SchemaVersion), "upgrade inferd"}},
		{"garbage", "x9", []string{`unknown schema version "x9"`, fmt.Sprintf("version %d", SchemaVersion), "upgrade inferd"}},
		{"zero", "0", []string{`unknown schema version "0"`, fmt.Sprintf("version %d", SchemaVersion)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := testPath(t)
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			_ = s.Close()
			setSchema(t, path, tc.version)
			before, _ := os.ReadFile(path)

			_, err = Open(path, Options{})
			if !errors.Is(err, ErrSchema) {
				t.Fatalf("Open = %v, want ErrSchema", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Error("Open changed the refused file")
			}
		})
	}
}

// realDB returns the bytes of a closed data file holding some calls, big
// enough to span many pages.
func realDB(t *testing.T) []byte {
	t.Helper()
	path := testPath(t)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	inputs := json.RawMessage(`{"blob":"` + strings.Repeat("x", 2000) + `"}`)
	for range 200 {
		if err := s.SaveCall(context.Background(), store.Call{ID: newCallID(), State: store.CallQueued, Inputs: inputs}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func foreignBolt(t *testing.T) []byte {
	t.Helper()
	path := testPath(t)
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket([]byte("widgets"))
		if err != nil {
			return err
		}
		return b.Put([]byte("a"), []byte("b"))
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	b, _ := os.ReadFile(path)
	return b
}

func TestOpenRefusesCorruptFileAndLeavesItUnchanged(t *testing.T) {
	random := make([]byte, 64<<10)
	_, _ = rand.Read(random)
	real := realDB(t)
	// bbolt preallocates the file past its last page: truncate the pages.
	m, err := readBoltMeta(bytes.NewReader(real), int64(len(real)))
	if err != nil {
		t.Fatal(err)
	}
	used := int(m.pgid) * int(m.pageSize)
	zeroedMeta := bytes.Clone(real)
	clear(zeroedMeta[:8192])

	for _, tc := range []struct {
		name    string
		content []byte
	}{
		{"random bytes", random},
		{"text file", []byte("hello, not a database\n")},
		{"truncated to half its pages", real[:used/2]},
		{"last page cut short", real[:used-100]},
		{"truncated to two pages", real[:8192]},
		{"truncated inside meta", real[:100]},
		{"meta pages zeroed", zeroedMeta},
		{"another program's bbolt file", foreignBolt(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := testPath(t)
			if err := os.WriteFile(path, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(path, Options{})
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded on a corrupt file")
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("Open = %v, want ErrCorrupt", err)
			}
			for _, w := range []string{path, "corrupt or not an inferd database", "restore from a backup"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(after, tc.content) {
				t.Error("Open changed the corrupt file")
			}
		})
	}
}

func TestOpenFailsClearlyWhileAnotherHolderHasTheFile(t *testing.T) {
	path := testPath(t)
	openAt(t, path, Options{})
	start := time.Now()
	_, err := Open(path, Options{Timeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("second Open = %v, want ErrInUse", err)
	}
	if !strings.Contains(err.Error(), "in use by another inferd process") {
		t.Errorf("error %q does not say the file is in use", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("second Open took %v despite a 100ms timeout", d)
	}
}

func TestWriteBackupOpensWithTheSameData(t *testing.T) {
	s := openTest(t)
	if _, err := s.PutProject(testProject("p1", "team-a")); err != nil {
		t.Fatal(err)
	}
	id := newCallID()
	if err := s.SaveCall(context.Background(), store.Call{ID: id, State: store.CallSucceeded, Outputs: json.RawMessage(`[1]`)}); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backup", "inferd.db")
	if err := os.MkdirAll(filepath.Dir(backup), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(backup)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.WriteBackup(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(backup); fi.Size() != n {
		t.Errorf("WriteBackup returned %d, file has %d bytes", n, fi.Size())
	}

	b := openAt(t, backup, Options{})
	if _, err := b.GetProject("p1"); err != nil {
		t.Errorf("backup GetProject: %v", err)
	}
	if c, err := b.GetCall(id); err != nil || string(c.Outputs) != `[1]` {
		t.Errorf("backup GetCall = %+v, %v", c, err)
	}
}
