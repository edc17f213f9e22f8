package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/scheduler/backend"
)

func TestLogSinkKeepsNGenerations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p", "r.log")
	s, err := openLogSink(path, 5, 2, nil, func(err error) { t.Error(err) })
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		s.Write(fmt.Appendf(nil, "line%d\n", i)) // 6 bytes: each write rotates
	}
	s.Write([]byte("tail\n"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"r.log": "tail\n", "r.log.1": "line4\n", "r.log.2": "line3\n"}
	for name, content := range want {
		got, err := os.ReadFile(filepath.Join(filepath.Dir(path), name))
		if err != nil || string(got) != content {
			t.Errorf("%s = %q (%v), want %q", name, got, err, content)
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("a third old generation exists with keep 2: %v", err)
	}
}

func TestTailLogReachesIntoOlderGenerations(t *testing.T) {
	dir := t.TempDir()
	path := LogPath(dir, "acme", "echo", "echo-1")
	os.MkdirAll(filepath.Dir(path), 0o755)
	write := func(name, s string) {
		if err := os.WriteFile(name, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(path+".2", "a\nb\n")
	write(path+".1", "c\r\nd\n\n")
	write(path, "e\nprogress 10%\rprogress 90%")
	tests := []struct {
		n    int
		want []string
	}{
		{1, []string{"progress 90%"}},
		{3, []string{"e", "progress 10%", "progress 90%"}},
		{5, []string{"c", "d", "e", "progress 10%", "progress 90%"}},
		{100, []string{"a", "b", "c", "d", "e", "progress 10%", "progress 90%"}},
	}
	b := LogDir(dir)
	size := int64(len("e\nprogress 10%\rprogress 90%"))
	for _, tc := range tests {
		got, next, err := b.TailLog(backend.Log{Team: "acme", Project: "echo", Replica: "echo-1"}, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) || next != size {
			t.Errorf("TailLog(%d) = %q, %d; want %q, %d", tc.n, got, next, tc.want, size)
		}
	}
	if _, _, err := b.TailLog(backend.Log{Team: "acme", Project: "echo", Replica: "echo-9"}, 10); !errors.Is(err, backend.ErrNoLog) {
		t.Errorf("missing log: err %v, want ErrNoLog", err)
	}
	if _, _, err := b.TailLog(backend.Log{Team: "..", Project: "acme", Replica: "echo"}, 10); !errors.Is(err, backend.ErrNoLog) {
		t.Errorf("a log outside the logs directory: err %v, want ErrNoLog", err)
	}
}

func TestTailLogDropsTheCutFirstLineOfALargeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.log")
	big := strings.Repeat("x", tailChunk) + "\nlast\n"
	if err := os.WriteFile(path, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path+".1", []byte("older\n"), 0o644)
	got, err := tailLog(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"last"}) {
		t.Errorf("got %d lines %.40q", len(got), got)
	}
}

func TestFindLogsNewestFirstPerTeam(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	// echo ran for team a, then was made again for team b.
	for i, l := range []struct{ team, id string }{{"a", "echo-1"}, {"b", "echo-2"}, {"b", "echo-3"}} {
		p := LogPath(dir, l.team, "echo", l.id)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("x\n"), 0o644)
		os.WriteFile(p+".1", []byte("x\n"), 0o644) // old generations are not replicas
		mod := now.Add(time.Duration([]int{-2, 0, -1}[i]) * time.Minute)
		os.Chtimes(p, mod, mod)
	}
	b := LogDir(dir)
	replicas := func(team string) []string {
		t.Helper()
		logs, err := b.ReplicaLogs(team, "echo")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, l := range logs {
			if _, err := os.Stat(LogPath(dir, l.Team, l.Project, l.Replica)); err != nil || l.Project != "echo" {
				t.Errorf("log %+v does not name a log file: %v", l, err)
			}
			ids = append(ids, l.Replica)
		}
		return ids
	}
	if got, want := replicas("b"), []string{"echo-2", "echo-3"}; !slices.Equal(got, want) {
		t.Errorf("team b sees %v, want %v", got, want)
	}
	if got, want := replicas("a"), []string{"echo-1"}; !slices.Equal(got, want) {
		t.Errorf("team a sees %v, want %v", got, want)
	}
	if got, want := replicas(""), []string{"echo-2", "echo-3", "echo-1"}; !slices.Equal(got, want) {
		t.Errorf("the operator sees %v, want %v", got, want)
	}
	if logs, err := b.ReplicaLogs("", "none"); err != nil || len(logs) != 0 {
		t.Errorf("project without logs: %v, %v", logs, err)
	}
	missing := LogDir(filepath.Join(dir, "missing"))
	if logs, err := missing.ReplicaLogs("", "echo"); err != nil || len(logs) != 0 {
		t.Errorf("no logs directory yet: %v, %v", logs, err)
	}
}

// syncBuffer collects what followLog writes, from its goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestFollowLogSeesAppendsAndRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.log")
	sink, err := openLogSink(path, 20, 1, nil, func(err error) { t.Error(err) })
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	sink.Write([]byte("before\n"))
	from, _ := logSize(path)

	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- followLog(ctx, path, from, time.Millisecond, &out) }()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for out.String() != want {
			if time.Now().After(deadline) {
				t.Fatalf("followed %q, want %q", out.String(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	sink.Write([]byte("one\n"))
	waitFor("one\n")
	sink.Write([]byte("two, which rotates\n")) // past 20 bytes: the file is rotated after it
	waitFor("one\ntwo, which rotates\n")
	sink.Write([]byte("three\n"))
	waitFor("one\ntwo, which rotates\nthree\n")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
