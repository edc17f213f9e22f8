package bolt

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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

// TestOpenRefusesAnEmptyFileButCreatesAMissingOne: a fresh install has no
// data file, and Open creates it whole (under a temporary name, linked into
// place), so a 0-byte data file is damage: refused, never started empty.
func TestOpenRefusesAnEmptyFileButCreatesAMissingOne(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "inferd.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{false, true} {
		s, err := Open(path, Options{ReadOnly: ro})
		if err == nil {
			_ = s.Close()
			t.Fatalf("Open(ReadOnly: %v) started on an empty file", ro)
		}
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "empty") {
			t.Errorf("Open(ReadOnly: %v) = %v, want ErrCorrupt saying the file is empty", ro, err)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
		t.Fatalf("the empty file changed: %v, %v", fi, err)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	s := openAt(t, path, Options{})
	if _, err := s.EnsureTeam("acme"); err != nil {
		t.Fatal(err)
	}
	if m := s.Migration(); m.From != 0 || m.To != SchemaVersion {
		t.Errorf("a new file: Migration() = %+v, want from 0 to %d", m, SchemaVersion)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The write-ahead log's next segment is prepared from Open on.
	entries = slices.DeleteFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), "inferd.db.wal.") })
	if len(entries) != 1 {
		t.Errorf("the data dir holds %v, want only inferd.db and its log", entries)
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
		{"empty (0 bytes)", nil},
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

// TestOpenRefusesDamagedTreePages flips bytes in the leaf and branch pages a
// data file uses, where bbolt reads without checking: the element table, a
// key's position, a child's page id, the page header. Unchecked, each of
// these panics inside the goroutine bbolt walks the tree in at open (or
// recurses until the stack overflows), killing the daemon with a raw trace.
// Open must refuse each with ErrCorrupt and leave the file as it was.
func TestOpenRefusesDamagedTreePages(t *testing.T) {
	real := realDB(t)
	pages := treePages(t, real)
	m, err := readBoltMeta(bytes.NewReader(real), int64(len(real)))
	if err != nil {
		t.Fatal(err)
	}
	ps := int(m.pageSize)
	type flip struct {
		name     string
		off, len int
	}
	header := []flip{
		{"page id", 0, 8},
		{"page flags", 8, 2},
		{"element count", 10, 2},
		{"overflow count", 12, 4},
	}
	for _, kind := range []struct {
		typ   string
		flips []flip
	}{
		{"leaf", append(header, flip{"first element's key position", 20, 4}, flip{"second element's sizes", 40, 8})},
		{"branch", append(header, flip{"first element's key position", 16, 4}, flip{"first child's page id", 24, 8}, flip{"second child's page id", 40, 8})},
	} {
		if len(pages[kind.typ]) == 0 {
			t.Fatalf("the test file has no %s page", kind.typ)
		}
		id := pages[kind.typ][0]
		for _, f := range kind.flips {
			t.Run(kind.typ+" "+f.name, func(t *testing.T) {
				content := bytes.Clone(real)
				for i := range f.len {
					content[id*ps+f.off+i] ^= 0xff
				}
				path := testPath(t)
				if err := os.WriteFile(path, content, 0o600); err != nil {
					t.Fatal(err)
				}
				s, err := Open(path, Options{})
				if err == nil {
					_ = s.Close()
					t.Fatal("Open succeeded on a file with a damaged page")
				}
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
					t.Errorf("Open = %v, want ErrCorrupt naming the file", err)
				}
				if after, _ := os.ReadFile(path); !bytes.Equal(after, content) {
					t.Error("Open changed the damaged file")
				}
			})
		}
	}
}

// TestOpenNeverPanicsOnFlippedBytes flips random bytes in the file's tree
// pages. Whatever the damage, Open either refuses with ErrCorrupt or opens a
// file that can be read through without a panic (a flipped byte inside a
// value is damage no page check can see; it surfaces as a decode error).
func TestOpenNeverPanicsOnFlippedBytes(t *testing.T) {
	real := realDB(t)
	pages := treePages(t, real)
	ids := append(append([]int(nil), pages["leaf"]...), pages["branch"]...)
	m, err := readBoltMeta(bytes.NewReader(real), int64(len(real)))
	if err != nil {
		t.Fatal(err)
	}
	ps := int(m.pageSize)
	rng := mathrand.New(mathrand.NewPCG(16, 16))
	refused := 0
	const rounds = 80
	for round := range rounds {
		content := bytes.Clone(real)
		id := ids[rng.IntN(len(ids))]
		// Mostly the header and element table, where bbolt trusts most.
		off := rng.IntN(ps)
		if round%2 == 0 {
			off = rng.IntN(64)
		}
		for i := range 1 + rng.IntN(8) {
			if id*ps+off+i < len(content) {
				content[id*ps+off+i] ^= byte(1 + rng.IntN(255))
			}
		}
		path := testPath(t)
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path, Options{})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("round %d (page %d, offset %d): Open = %v, want ErrCorrupt", round, id, off, err)
			}
			refused++
			continue
		}
		_, _ = s.PendingCalls()
		_ = s.view(func(tx *bbolt.Tx) error {
			return tx.ForEach(func(_ []byte, b *bbolt.Bucket) error {
				return b.ForEach(func(k, v []byte) error { return nil })
			})
		})
		if err := s.Close(); err != nil {
			t.Fatalf("round %d: Close: %v", round, err)
		}
	}
	if refused == 0 {
		t.Errorf("none of %d damaged files was refused: the flips missed every page bbolt reads", rounds)
	}
	t.Logf("%d of %d damaged files refused; the rest open and read without a panic", refused, rounds)
}

// treePages lists the branch and leaf pages of a data file's content.
func treePages(t *testing.T, content []byte) map[string][]int {
	t.Helper()
	path := testPath(t)
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	pages, _, err := TreePages(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return pages
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
