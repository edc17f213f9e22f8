package bolt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// errNoApply is what a test's applyHook fails applies with: the data file
// never gets the writes, as when the daemon is killed first.
var errNoApply = errors.New("test: the data file gets no writes")

// writeThenCrash opens a store at path whose applier never gets a write into
// the data file, runs write, and closes it: the log holds every write, the
// data file none of them, as a daemon killed before its applier caught up
// leaves them. It returns what the log held.
func writeThenCrash(t *testing.T, path string, write func(s *Store)) []string {
	t.Helper()
	// The applier waits for gate (its writes pending), then fails: no
	// attempt ends before Close, so no writer sees a failure.
	gate := make(chan struct{})
	s, err := Open(path, Options{applyHook: func() error { <-gate; return errNoApply }})
	if err != nil {
		t.Fatal(err)
	}
	write(s)
	close(gate)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files, err := WALFiles(path)
	if err != nil || len(files) == 0 {
		t.Fatalf("WALFiles after a crash = %v, %v: want the log kept", files, err)
	}
	return files
}

// crashCalls are the writes the replay tests make: a call created with
// large inputs, then running (a write without inputs), then finished with a
// large result; a call with small inputs and an idempotency key; a finished
// call with a webhook, whose deliveries the replay queues.
func crashCalls(t *testing.T) (big store.Call, small store.Call, hooked store.Call, bigIn, bigOut json.RawMessage) {
	bigIn = json.RawMessage(`"` + strings.Repeat("i", 3*payloadChunk) + `"`)
	bigOut = json.RawMessage(`"` + strings.Repeat("o", 2*payloadChunk) + `"`)
	now := time.Now().UTC()
	big = store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued, Created: now, Inputs: bigIn}
	small = store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued, Created: now,
		Inputs: json.RawMessage(`{"prompt":"hi"}`), IdempotencyKey: "k1", RequestHash: "h"}
	hooked = store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Created: now,
		Dispatched: now, Finished: now, Message: "success", Outputs: json.RawMessage(`{"ok":true}`),
		Webhook: "http://127.0.0.1:9/hook", WebhookEvents: []string{store.EventStart, store.EventCompleted}}
	return
}

func saveAll(t *testing.T, s *Store, calls ...store.Call) {
	t.Helper()
	for _, c := range calls {
		if err := s.SaveCall(context.Background(), c); err != nil {
			t.Fatalf("SaveCall(%s, %s) = %v", c.ID, c.State, err)
		}
	}
}

// checkCrashCalls checks that s answers the crashCalls as written.
func checkCrashCalls(t *testing.T, s *Store, big, small, hooked store.Call, bigIn, bigOut json.RawMessage) {
	t.Helper()
	got, err := s.GetCall(big.ID)
	if err != nil || got.State != store.CallSucceeded || got.Attempt != 1 || !bytes.Equal(got.Inputs, bigIn) || !bytes.Equal(got.Outputs, bigOut) {
		t.Errorf("GetCall(big) = %s attempt %d, %d bytes in, %d out, %v; want succeeded, attempt 1, its inputs and outputs",
			got.State, got.Attempt, len(got.Inputs), len(got.Outputs), err)
	}
	res, err := s.GetCallResult(big.ID)
	if err != nil || res.Inputs != nil || res.InputBytes != int64(len(bigIn)) || !bytes.Equal(res.Outputs, bigOut) {
		t.Errorf("GetCallResult(big) = inputs %d (%d bytes), outputs %d, %v", len(res.Inputs), res.InputBytes, len(res.Outputs), err)
	}
	if in, err := s.CallInputs(big.ID); err != nil || !bytes.Equal(in, bigIn) {
		t.Errorf("CallInputs(big) = %d bytes, %v", len(in), err)
	}
	if in, err := s.CallInputs(small.ID); err != nil || string(in) != string(small.Inputs) {
		t.Errorf("CallInputs(small) = %s, %v", in, err)
	}
	if c, err := s.CallByIdempotencyKey("t", "k1"); err != nil || c.ID != small.ID {
		t.Errorf("CallByIdempotencyKey = %s, %v; want %s", c.ID, err, small.ID)
	}
	if c, err := s.GetCall(hooked.ID); err != nil || c.State != store.CallSucceeded || string(c.Outputs) != `{"ok":true}` {
		t.Errorf("GetCall(hooked) = %+v, %v", c, err)
	}
}

func bigCallWrites(big store.Call, bigOut json.RawMessage) []store.Call {
	running := big
	running.Inputs, running.State, running.Dispatched, running.Attempt = nil, store.CallRunning, big.Created, 1
	done := running
	done.State, done.Message, done.Outputs, done.Finished = store.CallSucceeded, "success", bigOut, big.Created
	return []store.Call{big, running, done}
}

// TestLoggedWritesAreReadBeforeAndReplayedAfterACrash: a write is durable
// once logged, before the data file has it: reads answer from the log's
// writes (inputs carried by an earlier write, large payloads, idempotency
// keys), and a store killed before its applier caught up gets every write
// back at the next Open, indexes and webhook deliveries included, with the
// log folded in and removed.
func TestLoggedWritesAreReadBeforeAndReplayedAfterACrash(t *testing.T) {
	path := testPath(t)
	big, small, hooked, bigIn, bigOut := crashCalls(t)
	writeThenCrash(t, path, func(s *Store) {
		saveAll(t, s, bigCallWrites(big, bigOut)...)
		saveAll(t, s, small, hooked)
		checkCrashCalls(t, s, big, small, hooked, bigIn, bigOut)
		var inFile bool
		if err := s.view(func(tx *bbolt.Tx) error { inFile = tx.Bucket(bucketCalls).Get([]byte(big.ID)) != nil; return nil }); err != nil || inFile {
			t.Fatalf("the data file has the call before any apply (%v): the test proves nothing", err)
		}
	})

	s := openAt(t, path, Options{})
	checkCrashCalls(t, s, big, small, hooked, bigIn, bigOut)
	if files, _ := WALFiles(path); len(files) != 0 {
		t.Errorf("log files after replay: %v", files)
	}
	ds, err := s.PendingDeliveries()
	if err != nil || len(ds) != 2 {
		t.Errorf("PendingDeliveries after replay = %d, %v; want the webhook call's 2", len(ds), err)
	}
	if pend, err := s.PendingCalls(); err != nil || len(pend) != 1 || pend[0].ID != small.ID {
		t.Errorf("PendingCalls after replay = %v, %v; want the small call only", pend, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, problems, err := Check(path, time.Second)
	if err != nil || len(problems) > 0 {
		t.Errorf("Check after replay: %v %v", err, problems)
	}
}

// TestReplayAppliesEachWriteOnce: a crash after the data file took the
// writes but before their segments were removed replays nothing twice: a
// call expired meanwhile stays expired.
func TestReplayAppliesEachWriteOnce(t *testing.T) {
	path := testPath(t)
	old := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Finished: time.Now().Add(-time.Hour)}
	s := openAt(t, path, Options{})
	saveAll(t, s, old)
	if n, err := s.ExpireCalls(time.Now()); err != nil || n != 1 {
		t.Fatalf("ExpireCalls = %d, %v", n, err)
	}
	// Keep the segment the applier would have removed, as a crash would.
	files, _ := WALFiles(path)
	if len(files) != 1 {
		t.Fatalf("log files while open: %v", files)
	}
	seg, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(files[0], seg, 0o600); err != nil {
		t.Fatal(err)
	}
	s = openAt(t, path, Options{})
	if _, err := s.GetCall(old.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetCall of the expired call after a replay = %v, want ErrNotFound (applied twice)", err)
	}
}

// TestReplayStopsAtATornRecord: the last append cut short by a crash (its
// writers never heard back) is left out; every write before it is kept,
// whether the cut record is followed by the segment's zeros (a prepared
// segment, where the crash leaves the size as it was) or by garbage (a
// segment that grew).
func TestReplayStopsAtATornRecord(t *testing.T) {
	for _, tc := range []struct {
		name string
		tear func(seg []byte, cut, end int) []byte
	}{
		{"zeros after it", func(seg []byte, cut, end int) []byte { clear(seg[cut:end]); return seg }},
		{"garbage after it", func(seg []byte, cut, _ int) []byte { return append(seg[:cut:cut], "garbage"...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := testPath(t)
			a := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued}
			b := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued}
			files := writeThenCrash(t, path, func(s *Store) { saveAll(t, s, a, b) })
			seg, err := os.ReadFile(files[0])
			if err != nil {
				t.Fatal(err)
			}
			first, recs, err := readSegment(path, files[0])
			if err != nil || first != 1 || len(recs) != 2 {
				t.Fatalf("readSegment = %d, %d records, %v", first, len(recs), err)
			}
			end := walHeaderSize
			for _, r := range recs {
				end += walRecordHead + len(r.body)
			}
			if int64(len(seg)) != walSegmentSize || !allZero(seg[end:]) {
				t.Fatalf("segment of %d bytes, zeros after its records: %v; want a prepared segment of %d",
					len(seg), allZero(seg[end:]), walSegmentSize)
			}
			// Cut the last record short.
			torn := tc.tear(seg, end-len(recs[1].body)/2, end)
			if err := os.WriteFile(files[0], torn, 0o600); err != nil {
				t.Fatal(err)
			}
			s := openAt(t, path, Options{})
			if _, err := s.GetCall(a.ID); err != nil {
				t.Errorf("the whole first write: %v", err)
			}
			if _, err := s.GetCall(b.ID); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("the torn write: %v, want ErrNotFound", err)
			}
			// The next write continues the sequence: after another crash both
			// logs replay without a gap.
			c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued}
			saveAll(t, s, c)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openAt(t, path, Options{})
			if _, err := s.GetCall(c.ID); err != nil {
				t.Errorf("a write after the replay: %v", err)
			}
		})
	}
}

// TestFailedAppendIsReplacedByTheNextSegment: records of an append that
// failed (and whose writers were told so) may sit whole in the abandoned
// segment; the next segment starts at their LSNs and replaces them.
func TestFailedAppendIsReplacedByTheNextSegment(t *testing.T) {
	path := testPath(t)
	cw := func(id, state string) callWrite {
		return callWrite{key: []byte(id), value: []byte(`{"id":"` + id + `","state":"` + state + `"}`)}
	}
	w := openWAL(path, nil, 1, 0)
	if _, err := w.append([]callWrite{cw("call_a", "queued"), cw("call_b", "queued")}); err != nil {
		t.Fatal(err)
	}
	// The failed append: its record is whole in segment 1 ...
	if _, err := w.append([]callWrite{cw("call_failed", "queued")}); err != nil {
		t.Fatal(err)
	}
	w.abandon()
	w.next-- // ... but its writer was told it failed: the LSN is not used
	if _, err := w.append([]callWrite{cw("call_c", "queued")}); err != nil {
		t.Fatal(err)
	}
	w.close(false)
	_, segs, last, err := readWAL(path, 0)
	if err != nil || len(segs) != 2 || last != 3 {
		t.Fatalf("readWAL = %d segments, last %d, %v", len(segs), last, err)
	}
	if ids, want := replayedIDs(t, path, 0), []string{"call_a", "call_b", "call_c"}; !slices.Equal(ids, want) {
		t.Errorf("replayed %v, want %v", ids, want)
	}
}

// TestLogThatDoesNotContinueTheFileIsRefused: a log whose first write the
// data file does not reach (copied from another state of the file) stops
// Open with ErrCorrupt, and changes nothing.
func TestLogThatDoesNotContinueTheFileIsRefused(t *testing.T) {
	path := testPath(t)
	files := writeThenCrash(t, path, func(s *Store) {
		saveAll(t, s, store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued})
	})
	w := openWAL(path+".other", nil, 5, 0)
	if _, err := w.append([]callWrite{{key: []byte("call_x"), value: []byte(`{"id":"call_x"}`)}}); err != nil {
		t.Fatal(err)
	}
	w.close(false)
	other, _ := WALFiles(path + ".other")
	if err := os.Rename(other[0], files[0]); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(files[0])
	_, err := Open(path, Options{})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "does not continue") {
		t.Fatalf("Open = %v, want ErrCorrupt saying the log does not continue the file", err)
	}
	if after, _ := os.ReadFile(files[0]); !bytes.Equal(before, after) {
		t.Error("the refused log was changed")
	}
}

// TestReadOnlyOpenReadsTheLogAndLeavesIt: a store opened read-only on a
// killed daemon's files answers for the logged writes and lists them, and
// leaves data file and log as they were.
func TestReadOnlyOpenReadsTheLogAndLeavesIt(t *testing.T) {
	path := testPath(t)
	big, small, hooked, bigIn, bigOut := crashCalls(t)
	files := writeThenCrash(t, path, func(s *Store) {
		saveAll(t, s, bigCallWrites(big, bigOut)...)
		saveAll(t, s, small, hooked)
	})
	s := openAt(t, path, Options{ReadOnly: true})
	checkCrashCalls(t, s, big, small, hooked, bigIn, bigOut)
	var ids []string
	if err := s.EachCall(func(c store.Call) error { ids = append(ids, c.ID); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 {
		t.Errorf("EachCall listed %v, want the 3 logged calls", ids)
	}
	if err := s.SaveCall(context.Background(), small); err == nil {
		t.Error("SaveCall on a read-only store succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if after, _ := WALFiles(path); !slices.Equal(after, files) {
		t.Errorf("log files after a read-only open: %v, want %v", after, files)
	}
}

// TestApplyFailuresRefuseNewWritesUntilTheFileTakesThemAgain: while the data
// file cannot take the logged writes (a full disk), a new write asks for an
// attempt at once and fails with its error, and is not logged; once an
// attempt succeeds, writes go through again and every write logged before
// is in the file.
func TestApplyFailuresRefuseNewWritesUntilTheFileTakesThemAgain(t *testing.T) {
	var full atomic.Bool
	s := openAt(t, testPath(t), Options{applyHook: func() error {
		if full.Load() {
			return syscall.ENOSPC
		}
		return nil
	}})
	full.Store(true)
	first := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued}
	saveAll(t, s, first) // logged: durable, whatever the file does next
	second := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued}
	err := s.SaveCall(context.Background(), second)
	for err == nil { // the first attempt may not have run yet
		second.ID = newCallID()
		err = s.SaveCall(context.Background(), second)
	}
	if !errors.Is(err, store.ErrStorageFull) {
		t.Fatalf("a write while applies fail = %v, want ErrStorageFull", err)
	}
	if _, err := s.GetCall(second.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the refused write is readable: %v", err)
	}
	if _, err := s.GetCall(first.ID); err != nil {
		t.Errorf("the logged write is not readable while the file is full: %v", err)
	}
	full.Store(false)
	third := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued}
	saveAll(t, s, third)
	pend, err := s.PendingCalls() // a scan of the data file
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, c := range pend {
		got[c.ID] = true
	}
	if !got[first.ID] || !got[third.ID] || got[second.ID] {
		t.Errorf("PendingCalls = %v, want the first and third calls", got)
	}
}

// TestCleanCloseFoldsTheLogIntoTheDataFile: after Close the data file alone
// holds everything (it can be copied, backed up or checked), with no log.
func TestCleanCloseFoldsTheLogIntoTheDataFile(t *testing.T) {
	path := testPath(t)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued}
	saveAll(t, s, c)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if files, _ := WALFiles(path); len(files) != 0 {
		t.Errorf("log files after Close: %v", files)
	}
	calls, problems, err := Check(path, time.Second)
	if err != nil || len(problems) > 0 || calls[c.ID].ID != c.ID {
		t.Errorf("Check after Close = %v, %v, %v", calls, problems, err)
	}
}

// walWrites makes n call writes of about size bytes each, ids from base.
func walWrites(base, n, size int) []callWrite {
	cws := make([]callWrite, n)
	pad := strings.Repeat("x", size)
	for i := range cws {
		id := fmt.Sprintf("call_%08d", base+i)
		cws[i] = callWrite{key: []byte(id), value: []byte(`{"id":"` + id + `","pad":"` + pad + `"}`)}
	}
	return cws
}

// replayedIDs reads the log at path as Open would (after applied) and
// returns the ids of the writes, in order.
func replayedIDs(t *testing.T, path string, applied uint64) []string {
	t.Helper()
	recs, _, _, err := readWAL(path, applied)
	if err != nil {
		t.Fatalf("readWAL: %v", err)
	}
	var ids []string
	for _, r := range recs {
		c, err := decodeWALWrite(r.body)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, string(c.key))
	}
	return ids
}

func idsOf(groups ...[]callWrite) []string {
	var ids []string
	for _, g := range groups {
		for _, cw := range g {
			ids = append(ids, string(cw.key))
		}
	}
	return ids
}

func fileSizeOf(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestAppendsFillPreparedSegmentsWithoutGrowingThem: appends go into
// segments made ahead at their full size, so no append changes a file's
// size (what makes its fdatasync cheap); a group that does not fit in what
// is left moves to the next prepared segment, one larger than a whole
// segment goes alone into one that grows; and after a crash (no clean
// close) the log replays every write once, in order, across the zero tails.
func TestAppendsFillPreparedSegmentsWithoutGrowingThem(t *testing.T) {
	path := testPath(t)
	w := openWAL(path, nil, 1, 0)
	var groups [][]callWrite
	base := 0
	// 100 KiB groups: about 80 fill a segment; 120 take the writer into a
	// second one, prepared while the first was half used.
	for range 120 {
		g := walWrites(base, 10, 10<<10)
		base += len(g)
		if _, err := w.append(g); err != nil {
			t.Fatal(err)
		}
		groups = append(groups, g)
		if got := fileSizeOf(t, w.cur.Name()); got != walSegmentSize {
			t.Fatalf("segment %s is %d bytes after an append, want it kept at %d", w.cur.Name(), got, walSegmentSize)
		}
	}
	files, _ := WALFiles(path)
	if len(files) < 2 {
		t.Fatalf("log files after %d KiB of appends: %v, want a second segment", 120*100, files)
	}
	huge := walWrites(base, 1, walSegmentSize+1<<20)
	if _, err := w.append(huge); err != nil {
		t.Fatal(err)
	}
	groups = append(groups, huge)
	after := walWrites(base+1, 3, 100)
	if _, err := w.append(after); err != nil {
		t.Fatal(err)
	}
	groups = append(groups, after)
	w.abandon() // the crash: no close, the segment being prepared left as it is
	if w.prep != nil {
		w.takePrepared()
	}
	if got, want := replayedIDs(t, path, 0), idsOf(groups...); !slices.Equal(got, want) {
		t.Fatalf("replayed %d writes, want the %d appended, in order", len(got), len(want))
	}
	if got := replayedIDs(t, path, 500); len(got) != len(idsOf(groups...))-500 {
		t.Errorf("replay after 500 applied: %d writes", len(got))
	}
}

// TestUnusedPreparedSegmentIsDroppedAtOpen: a daemon killed with a segment
// prepared and not yet used (all zeros) leaves nothing to replay; Open
// applies the rest of the log and removes every segment.
func TestUnusedPreparedSegmentIsDroppedAtOpen(t *testing.T) {
	path := testPath(t)
	a := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued}
	writeThenCrash(t, path, func(s *Store) { saveAll(t, s, a) })
	// What the killed daemon had prepared next.
	next := segmentPath(path, 99)
	if err := os.WriteFile(next, make([]byte, walSegmentSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkWALVersion(path); err != nil {
		t.Fatalf("checkWALVersion with a prepared segment: %v", err)
	}
	s := openAt(t, path, Options{})
	if _, err := s.GetCall(a.ID); err != nil {
		t.Errorf("the logged write after the replay: %v", err)
	}
	// The reopened store's log starts again at segment 1 and may already
	// have prepared it under the same name (even the same inode): what must
	// be gone is what the killed daemon logged, and its prepared segment.
	if ids := replayedIDs(t, path, 0); len(ids) != 0 {
		t.Errorf("the log after the replay still holds %d writes (%v), want none", len(ids), ids)
	}
	if _, err := os.Stat(next); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after the replay: %v, want it removed", next, err)
	}
}

// TestSegmentThatCannotBePreparedIsMadeAsBefore: when the next segment
// cannot be prepared (here its name is taken; a full disk does the same)
// the writer makes one that grows with its appends, and nothing is lost.
func TestSegmentThatCannotBePreparedIsMadeAsBefore(t *testing.T) {
	path := testPath(t)
	if err := os.WriteFile(segmentPath(path, 1), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w := openWAL(path, nil, 1, 0)
	g := walWrites(0, 5, 100)
	if _, err := w.append(g); err != nil {
		t.Fatalf("append with no prepared segment: %v", err)
	}
	if got := fileSizeOf(t, segmentPath(path, 2)); got >= walSegmentSize {
		t.Errorf("the segment made instead is %d bytes, want it grown to its records only", got)
	}
	if err := w.close(false); err != nil {
		t.Fatal(err)
	}
	if got := replayedIDs(t, path, 0); !slices.Equal(got, idsOf(g)) {
		t.Errorf("replayed %v, want %v", got, idsOf(g))
	}
}

// BenchmarkWALAppendZeroedVsGrowing times one small group commit (a 600-byte
// record, pwrite + fdatasync) into a prepared, zero-filled segment and into
// a segment that grows with each append, alternately in the same loop, so
// that both see the same disk: zeroed-p50-µs against growing-p50-µs.
func BenchmarkWALAppendZeroedVsGrowing(b *testing.B) {
	dir := b.TempDir()
	zeroed := openWAL(filepath.Join(dir, "z.db"), nil, 1, 0)
	growing := openWAL(filepath.Join(dir, "g.db"), nil, 1, 0)
	growing.dropPrepared() // makes its segments as before
	defer zeroed.close(true)
	defer growing.close(true)
	rec := walWrites(0, 1, 500)
	var zd, gd []time.Duration
	for b.Loop() {
		for _, c := range []struct {
			w *wal
			d *[]time.Duration
		}{{zeroed, &zd}, {growing, &gd}} {
			start := time.Now()
			if _, err := c.w.append(rec); err != nil {
				b.Fatal(err)
			}
			*c.d = append(*c.d, time.Since(start))
		}
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2]) / float64(time.Microsecond)
	}
	b.ReportMetric(p50(zd), "zeroed-p50-µs")
	b.ReportMetric(p50(gd), "growing-p50-µs")
}

// TestLargePayloadsAreLoggedFromTheirOwnBuffers: a write's large inputs and
// outputs go into the log straight from the buffers the caller gave (issue
// 41: a 60 MiB reply was copied whole into the log's buffer first), and
// the records read back as they were written, CRCs and all, beside small
// writes in the same group.
func TestLargePayloadsAreLoggedFromTheirOwnBuffers(t *testing.T) {
	path := testPath(t)
	w := openWAL(path, nil, 1, 0)
	in := bytes.Repeat([]byte("i"), 3*payloadChunk+1)
	out := bytes.Repeat([]byte("o"), 2*payloadChunk+7)
	group := walWrites(0, 3, 10)
	group[1].hasInputs, group[1].inputs, group[1].outputs = true, in, out
	group[2].outputs = []byte(`"small"`)
	group[2].encodedDeliveries = [][]byte{[]byte(`{"team":"t"}`)}

	e := &w.enc
	for i := range group {
		e.record(uint64(i+1), &group[i])
	}
	pieces, size := e.pieces()
	var own, total int
	for _, p := range pieces {
		total += len(p)
		if &p[0] == &in[0] || &p[0] == &out[0] {
			own++
		}
	}
	if own != 2 || int64(total) != size || len(pieces) != 5 {
		t.Errorf("%d pieces (%d bytes, size %d), %d of them the payloads' own buffers; want 5, 2", len(pieces), total, size, own)
	}
	e.reset()

	if _, err := w.append(group); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(e.parts[:cap(e.parts)], func(p walPart) bool { return p.ext != nil }) {
		t.Error("the log still refers to a payload after the append")
	}
	w.close(false)
	recs, _, _, err := readWAL(path, 0)
	if err != nil || len(recs) != len(group) {
		t.Fatalf("readWAL = %d records, %v; want %d", len(recs), err, len(group))
	}
	for i, r := range recs {
		got, err := decodeWALWrite(r.body)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		want := group[i]
		if !bytes.Equal(got.key, want.key) || !bytes.Equal(got.value, want.value) || got.hasInputs != want.hasInputs ||
			!bytes.Equal(got.inputs, want.inputs) || !bytes.Equal(got.outputs, want.outputs) || len(got.deliveries) != len(want.encodedDeliveries) {
			t.Errorf("record %d read back differs from the write: %s, %d bytes in, %d out, %d deliveries",
				i, got.key, len(got.inputs), len(got.outputs), len(got.deliveries))
		}
	}
}
