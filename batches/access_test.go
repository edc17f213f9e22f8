package batches

import (
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
)

// A key limited to some of its team's projects reaches only the files and
// batches that concern those: its own uploads, the batches of its projects
// and their output files. Everything else of its team, another team's,
// answers ErrNotFound, as what does not exist; an admin reaches all.
func TestAKeyLimitedToProjectsReachesOnlyWhatConcernsThem(t *testing.T) {
	sched := newFakeSched()
	sched.auto = true
	m := startManager(t, t.TempDir(), sched)
	llmOnly := Access{Team: "acme", Projects: []string{"llm"}}
	elseOnly := Access{Team: "acme", Projects: []string{"else"}}
	whole, admin, other := Team("acme"), Access{Team: "ops", Admin: true}, Team("other")

	teamFile, err := m.PutFile(whole, "in.jsonl", PurposeBatch, strings.NewReader(jsonl(2, chatLine)))
	if err != nil {
		t.Fatal(err)
	}
	ownFile, err := m.PutFile(llmOnly, "in.jsonl", PurposeBatch, strings.NewReader(jsonl(2, chatLine)))
	if err != nil {
		t.Fatal(err)
	}
	req := CreateRequest{InputFileID: ownFile.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}
	if _, err := m.CreateBatch(elseOnly, req, resolve); !errors.Is(err, ErrNotFound) {
		t.Errorf("a key limited to another project made a batch of llm's file: %v", err)
	}
	b, err := m.CreateBatch(llmOnly, req, resolve)
	if err != nil {
		t.Fatal(err)
	}
	b = waitStatus(t, m.Manager, "acme", b.ID, StatusCompleted)

	for _, tc := range []struct {
		name  string
		acc   Access
		reach map[string]bool // file or batch id: reached
	}{
		{"the whole team", whole, map[string]bool{teamFile.ID: true, ownFile.ID: true, b.ID: true, *b.OutputFileID: true}},
		{"limited to llm", llmOnly, map[string]bool{teamFile.ID: false, ownFile.ID: true, b.ID: true, *b.OutputFileID: true}},
		{"limited to another project", elseOnly, map[string]bool{teamFile.ID: false, ownFile.ID: false, b.ID: false, *b.OutputFileID: false}},
		{"admin", admin, map[string]bool{teamFile.ID: true, ownFile.ID: true, b.ID: true, *b.OutputFileID: true}},
		{"another team", other, map[string]bool{teamFile.ID: false, ownFile.ID: false, b.ID: false, *b.OutputFileID: false}},
	} {
		for id, want := range tc.reach {
			var err error
			if id == b.ID {
				_, err = m.Batch(tc.acc, id)
				if _, cerr := m.CancelBatch(tc.acc, id); !errors.Is(cerr, ErrNotFound) != want {
					t.Errorf("%s: cancel batch: %v", tc.name, cerr)
				}
			} else {
				_, err = m.File(tc.acc, id)
				if _, _, cerr := m.OpenContent(tc.acc, id); !errors.Is(cerr, ErrNotFound) != want {
					t.Errorf("%s: content of %s: %v", tc.name, id, cerr)
				}
			}
			if reached := !errors.Is(err, ErrNotFound); reached != want {
				t.Errorf("%s reaches %s: %v (%v), want %v", tc.name, id, reached, err, want)
			}
		}
	}
	// An admin's batch of acme's project is acme's: its calls are acme's,
	// found again by acme's idempotency keys.
	ab, err := m.CreateBatch(admin, CreateRequest{InputFileID: teamFile.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Batch(whole, ab.ID); err != nil {
		t.Errorf("acme's key does not see the batch an admin made of its project: %v", err)
	}
	if _, err := m.DeleteFile(elseOnly, ownFile.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("a key limited to another project deleted llm's file: %v", err)
	}
	if _, err := m.File(whole, ownFile.ID); err != nil {
		t.Errorf("the file is gone: %v", err)
	}
}

// feed yields n bytes, and may stop after stopAt of them until resumed.
type feed struct {
	n, given, stopAt int64
	reached, resume  chan struct{}
	once             sync.Once
}

func (f *feed) Read(p []byte) (int, error) {
	if f.stopAt > 0 && f.given >= f.stopAt {
		f.once.Do(func() { close(f.reached); <-f.resume })
	}
	if f.given >= f.n {
		return 0, io.EOF
	}
	k := min(int64(len(p)), f.n-f.given)
	if f.stopAt > f.given {
		k = min(k, f.stopAt-f.given)
	}
	for i := range k {
		p[i] = 'x'
	}
	f.given += k
	return int(k), nil
}

// An upload over its team's bytes is refused before it writes beyond them:
// no more is read of it than the room left and one copy buffer.
func TestUploadIsRefusedBeforeItWritesBeyondTheTeamsBytes(t *testing.T) {
	m := startManager(t, t.TempDir(), newFakeSched()) // 1 MiB a file, 3 MiB a team
	for range 2 {
		if _, err := m.PutFile(Team("acme"), "f", PurposeBatch, strings.NewReader(strings.Repeat("x", 1<<20))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.PutFile(Team("acme"), "f", PurposeBatch, strings.NewReader(strings.Repeat("x", 1<<19))); err != nil {
		t.Fatal(err)
	}
	in := &feed{n: 1 << 20} // 1 MiB where 512 KiB are left
	var be *BudgetError
	if _, err := m.PutFile(Team("acme"), "f", PurposeBatch, in); !errors.As(err, &be) {
		t.Fatalf("over the team's bytes: %v", err)
	}
	if in.given > 1<<19+32<<10 {
		t.Errorf("read %d bytes of an upload with %d of room before refusing it", in.given, 1<<19)
	}
}

// Two uploads under way at once are held together to the team's bytes:
// what one has written is reserved, so the other is refused, and no more
// than the budget ever lands on disk.
func TestConcurrentUploadsStayWithinTheTeamsBytes(t *testing.T) {
	m := startManager(t, t.TempDir(), newFakeSched()) // 1 MiB a file, 3 MiB a team
	if _, err := m.PutFile(Team("acme"), "f", PurposeBatch, strings.NewReader(strings.Repeat("x", 1<<20))); err != nil {
		t.Fatal(err)
	}
	first := &feed{n: 1 << 20, stopAt: 1<<20 - 1, reached: make(chan struct{}), resume: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := m.PutFile(Team("acme"), "first", PurposeBatch, first)
		done <- err
	}()
	<-first.reached // the first upload has written all but its last byte
	if _, err := m.PutFile(Team("acme"), "second", PurposeBatch, strings.NewReader(strings.Repeat("x", 1<<20))); err != nil {
		t.Fatalf("the second upload, within the budget with the first: %v", err)
	}
	var be *BudgetError
	if _, err := m.PutFile(Team("acme"), "third", PurposeBatch, strings.NewReader("xx")); !errors.As(err, &be) {
		t.Errorf("a third upload while the first is under way: %v; want refused (3 MiB held or reserved)", err)
	}
	close(first.resume)
	if err := <-done; err != nil {
		t.Errorf("the first upload: %v", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if held := m.teamBytes("acme"); held != 3<<20 || len(m.uploading) != 0 {
		t.Errorf("the team holds %d bytes with %v reserved, want 3 MiB and none", held, m.uploading)
	}
}
