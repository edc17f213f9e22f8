package batches

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// Files and ended batches have a lifetime (Config.Retention, OpenAI's 30
// days by default): a file is removed that long after its creation,
// unless a batch not yet ended reads it, and an ended batch that long
// after it ended, with its output and error files; nothing of them is
// left on disk.
func TestFilesAndEndedBatchesExpireAfterTheirRetention(t *testing.T) {
	dir := t.TempDir()
	sched := newFakeSched()
	clock := newFakeClock()
	m := startManagerWith(t, Config{Dir: dir, Sched: sched, Store: fakeStore{llm(), sched}, Clock: clock, Retention: 90 * time.Minute})
	clock.waitArmed(t, sweepEvery)   // the first sweep is done
	sweep := func(d time.Duration) { // d >= sweepEvery: a sweep is due
		clock.advance(d)
		clock.waitArmed(t, sweepEvery) // the sweep it ran is done
	}
	unread, _ := m.PutFile(Team("acme"), "unread.jsonl", PurposeBatch, strings.NewReader(jsonl(1, chatLine)))
	in, _ := m.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(2, chatLine)))
	b, err := m.CreateBatch(Team("acme"), CreateRequest{InputFileID: in.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h",
		Metadata: map[string]string{"k": "v"}}, resolve)
	if err != nil {
		t.Fatal(err)
	}
	waitPending(t, sched, 2)

	sweep(2 * time.Hour)
	if _, err := m.File(Team("acme"), unread.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("a file past its retention: %v, want it removed", err)
	}
	if _, err := m.File(Team("acme"), in.ID); err != nil {
		t.Errorf("the input file of a batch still running: %v, want it kept", err)
	}

	sched.answerAll(func(int) bool { return true })
	b = waitStatus(t, m.Manager, "acme", b.ID, StatusCompleted)
	if b.Metadata["k"] != "v" || b.OutputFileID == nil {
		t.Fatalf("ended %+v", b)
	}
	sweep(time.Hour) // the batch ended an hour ago: kept
	if _, err := m.Batch(Team("acme"), b.ID); err != nil {
		t.Errorf("a batch that ended within its retention: %v", err)
	}
	if _, err := m.File(Team("acme"), *b.OutputFileID); err != nil {
		t.Errorf("its output file: %v", err)
	}
	sweep(time.Hour)
	if _, err := m.Batch(Team("acme"), b.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("a batch past its retention: %v, want it removed", err)
	}
	if ids := m.BatchIDs(Team("acme")); len(ids) != 0 {
		t.Errorf("listed %v", ids)
	}
	for _, id := range []string{in.ID, *b.OutputFileID} {
		if _, err := m.File(Team("acme"), id); !errors.Is(err, ErrNotFound) {
			t.Errorf("file %s: %v, want it removed", id, err)
		}
	}
	for _, sub := range []string{"files", "batches"} {
		if entries, _ := os.ReadDir(dir + "/" + sub); len(entries) != 0 {
			t.Errorf("%s/ still holds %d entries", sub, len(entries))
		}
	}
}

// An ended batch is held in memory only as what finds, lists and expires
// it; its record (metadata, counts, errors) is read from disk when asked
// for, before and after a restart, which reads no more of it either
// (issue 41: every record was held, and read back at start: 1.17 GB after
// a restart).
func TestAnEndedBatchIsReadFromDiskNotHeld(t *testing.T) {
	dir := t.TempDir()
	sched := newFakeSched()
	sched.auto = true
	first := startManager(t, dir, sched)
	f, _ := first.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(3, chatLine)))
	md := map[string]string{"k": strings.Repeat("v", 512)}
	b, err := first.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h", Metadata: md}, resolve)
	if err != nil {
		t.Fatal(err)
	}
	want := waitStatus(t, first.Manager, "acme", b.ID, StatusCompleted)
	first.stop()

	second := startManager(t, dir, sched)
	for name, m := range map[string]*Manager{"before the restart": first.Manager, "after": second.Manager} {
		m.mu.Lock()
		held, ended := len(m.batches), len(m.ended)
		m.mu.Unlock()
		if held != 0 || ended != 1 {
			t.Errorf("%s: %d batch records held whole, %d ended; want 0 and 1", name, held, ended)
		}
		got, err := m.Batch(Team("acme"), b.ID)
		if err != nil || got.Metadata["k"] != md["k"] || got.RequestCounts != want.RequestCounts || got.Status != StatusCompleted {
			t.Errorf("%s: %+v %v, want %+v", name, got, err, want)
		}
		if ids := m.BatchIDs(Team("acme")); len(ids) != 1 || ids[0] != b.ID {
			t.Errorf("%s: listed %v", name, ids)
		}
		if _, err := m.Batch(Team("other"), b.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: another team's: %v", name, err)
		}
	}
}
