package scheduler

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"inferd/gpu"
	"inferd/scheduler/backend"
	"inferd/store"
	"inferd/store/memstore"
)

// fakeClock is a Clock driven by Advance.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c  *fakeClock
	at time.Time
	f  func()
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	if d <= 0 {
		go f() // due now, like time.AfterFunc
		return t
	}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	n := len(t.c.timers)
	t.c.timers = slices.DeleteFunc(t.c.timers, func(x *fakeTimer) bool { return x == t })
	return len(t.c.timers) < n
}

// Advance moves time forward by d, firing due timers in order, each at its
// own time.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.at.After(end) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			break
		}
		c.timers = slices.DeleteFunc(c.timers, func(x *fakeTimer) bool { return x == next })
		if next.at.After(c.now) {
			c.now = next.at
		}
		c.mu.Unlock()
		next.f()
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

// testStore is the in-memory store with the helpers these tests use. Its
// writer goroutine runs in the test's synctest bubble: create it inside the
// bubble and close it before the bubble ends.
type testStore struct {
	*memstore.Store
	t testing.TB
	// inputsErr, when set, is what CallInputs answers.
	inputsErr atomic.Pointer[error]
	// resultReads counts GetCallResult calls.
	resultReads atomic.Int64
	// afterResultRead, when set, runs after each GetCallResult read, before
	// it returns: what another node does meanwhile.
	afterResultRead atomic.Pointer[func()]
	// resultErr, when set, is what GetCallResult answers.
	resultErr atomic.Pointer[error]
	// usageErr, when set, is what AddUsage answers (writing nothing).
	usageErr atomic.Pointer[error]
	// afterKeyRead, when set, runs after each CallByIdempotencyKey read,
	// before it returns: a slow etcd, or what happens meanwhile.
	afterKeyRead atomic.Pointer[func()]
	// pendingErrs, while not empty, is what PendingCalls answers, one
	// error a read (a store without quorum).
	pendingMu   sync.Mutex
	pendingErrs []error
}

// PendingCalls answers the next of pendingErrs while there is one.
func (s *testStore) PendingCalls() ([]store.Call, error) {
	s.pendingMu.Lock()
	if len(s.pendingErrs) > 0 {
		err := s.pendingErrs[0]
		s.pendingErrs = s.pendingErrs[1:]
		s.pendingMu.Unlock()
		return nil, err
	}
	s.pendingMu.Unlock()
	return s.Store.PendingCalls()
}

// CallByIdempotencyKey runs afterKeyRead after the read.
func (s *testStore) CallByIdempotencyKey(teamID, key string) (store.Call, error) {
	c, err := s.Store.CallByIdempotencyKey(teamID, key)
	if f := s.afterKeyRead.Load(); f != nil {
		(*f)()
	}
	return c, err
}

// AddUsage writes to the memstore unless failUsage was called.
func (s *testStore) AddUsage(rows []store.UsageRow) error {
	if err := s.usageErr.Load(); err != nil && *err != nil {
		return *err
	}
	return s.Store.AddUsage(rows)
}

// failUsage makes every later AddUsage fail with err (nil: succeed again).
func (s *testStore) failUsage(err error) { s.usageErr.Store(&err) }

// GetCallResult counts the reads of results.
func (s *testStore) GetCallResult(id string) (store.Call, error) {
	s.resultReads.Add(1)
	if err := s.resultErr.Load(); err != nil && *err != nil {
		return store.Call{}, *err
	}
	c, err := s.Store.GetCallResult(id)
	if f := s.afterResultRead.Load(); f != nil {
		(*f)()
	}
	return c, err
}

// CallInputs reads from the memstore unless failInputs was called.
func (s *testStore) CallInputs(id string) (json.RawMessage, error) {
	if err := s.inputsErr.Load(); err != nil {
		return nil, *err
	}
	return s.Store.CallInputs(id)
}

// failInputs makes every later CallInputs fail with err.
func (s *testStore) failInputs(err error) { s.inputsErr.Store(&err) }

// The scheduler runs on any store.Store.
var _ Store = store.Store(nil)

func newTestStore(t testing.TB, projects ...store.Project) *testStore {
	s := &testStore{Store: memstore.New(memstore.Options{}), t: t}
	for _, p := range projects {
		s.putProject(p)
	}
	return s
}

func (s *testStore) close() { _ = s.Close() }

// setHold makes the store hold back each call write for which f returns
// true until release is called (see memstore.HoldCallWrites).
func (s *testStore) setHold(f func(store.Call) bool) { s.HoldCallWrites(f) }

// release lets one held write through, once the writer has reached it.
func (s *testStore) release() { s.ReleaseCallWrite() }

// setFail makes each call write for which f returns an error fail with it.
func (s *testStore) setFail(f func(store.Call) error) { s.FailCallWrites(f) }

// diskFullOnFinalWrites, for setFail: a call's final write finds the disk
// full; its earlier writes land.
func diskFullOnFinalWrites(c store.Call) error {
	if c.State.Done() {
		return errors.New("mmap: no space left on device")
	}
	return nil
}

// putProject stores p as the scheduler will read it; like an admin write,
// it tells the scheduler nothing (tests call ProjectChanged).
func (s *testStore) putProject(p store.Project) {
	s.t.Helper()
	if _, err := s.PutProject(p); err != nil {
		s.t.Fatalf("put project %s: %v", p.ID, err)
	}
}

func (s *testStore) deleteProject(id string) {
	s.t.Helper()
	if err := s.DeleteProject(id); err != nil {
		s.t.Fatalf("delete project %s: %v", id, err)
	}
}

// putCall stores c durably, as a previous run of the daemon left it.
func (s *testStore) putCall(c store.Call) {
	s.t.Helper()
	if err := s.SaveCall(context.Background(), c); err != nil {
		s.t.Fatalf("save call %s: %v", c.ID, err)
	}
}

func (s *testStore) call(id string) (store.Call, bool) {
	c, err := s.GetCall(id)
	return c, err == nil
}

// states returns the states written for call id, in order.
func (s *testStore) states(id string) []store.CallState {
	var out []store.CallState
	for _, c := range s.CallHistory(id) {
		out = append(out, c.State)
	}
	return out
}

// fakeBackend hands out fakeInstances; tests take them from launched in
// launch order. Its capacity is cpuSlots CPU slots and the GPUs of gpus.
type fakeBackend struct {
	launched chan *fakeInstance
	cpuSlots int
	gpus     Inventory // nil = none
	// fail, when set, makes Launch fail for a spec.
	mu   sync.Mutex
	fail func(backend.Spec) error
	pids int // launches so far: each instance gets a pid of its own
	// auto makes instances ready at once and answer every call with reply.
	auto  bool
	reply json.RawMessage
}

func newFakeBackend(cpuSlots int, gpus Inventory) *fakeBackend {
	return &fakeBackend{launched: make(chan *fakeInstance, 1000), cpuSlots: cpuSlots, gpus: gpus}
}

// Inventory is where a fakeBackend reads its GPUs: fakeGPUs, liveGPUs, or
// cpuSlots (none, and a number of CPU slots).
type Inventory interface {
	Devices() []gpu.Device
}

// cpuSlots is an Inventory with no GPUs that gives the fake backend that
// many CPU slots.
type cpuSlots int

func (cpuSlots) Devices() []gpu.Device { return nil }

func (l *fakeBackend) Capacity() backend.Capacity {
	c := backend.Capacity{CPUSlots: l.cpuSlots}
	if l.gpus != nil {
		c.GPUs = l.gpus.Devices()
	}
	return c
}

func (l *fakeBackend) Recover(context.Context) error { return nil }

// RefreshGPUs passes the scheduler's request for a fresh GPU read on to
// an inventory that counts them (liveGPUs).
func (l *fakeBackend) RefreshGPUs() {
	if r, ok := l.gpus.(interface{ RefreshSoon() }); ok {
		r.RefreshSoon()
	}
}

func (l *fakeBackend) ReplicaLogs(team, project string) ([]backend.Log, error) { return nil, nil }

func (l *fakeBackend) TailLog(backend.Log, int) ([]string, int64, error) {
	return nil, 0, backend.ErrNoLog
}

func (l *fakeBackend) FollowLog(context.Context, backend.Log, int64, io.Writer) error {
	return backend.ErrNoLog
}

func (l *fakeBackend) Launch(spec backend.Spec) (backend.Instance, error) {
	l.mu.Lock()
	fail := l.fail
	l.pids++
	pid := 1000 + l.pids
	l.mu.Unlock()
	if fail != nil {
		if err := fail(spec); err != nil {
			return nil, err
		}
	}
	i := &fakeInstance{
		spec:    spec,
		pid:     pid,
		ready:   make(chan struct{}),
		exited:  make(chan struct{}),
		stopped: make(chan struct{}),
		calls:   make(chan *fakeCall),
		batches: make(chan *fakeBatch),
		auto:    l.auto,
		reply:   l.reply,
	}
	if l.auto {
		close(i.ready)
		return i, nil
	}
	l.launched <- i
	return i, nil
}

// fakeInstance is a model server under the test's control.
type fakeInstance struct {
	spec    backend.Spec
	pid     int
	ready   chan struct{}
	exited  chan struct{}
	stopped chan struct{} // closed by the first Stop
	calls   chan *fakeCall
	batches chan *fakeBatch
	auto    bool
	reply   json.RawMessage
	// ignoreCancel: a model whose request does not end when Infer's ctx
	// does, only when answered or when the process exits.
	ignoreCancel atomic.Bool
	// uses, when set, is what Measure reports for each stretch; unset, the
	// instance measures nothing (CPUKnown false, no energy).
	uses atomic.Pointer[backend.Usage]

	mu       sync.Mutex
	exitErr  error
	lastLine string
	problem  backend.BootProblem // what BootProblem returns
	stopOnce sync.Once
	exitOnce sync.Once
}

// fakeCall is one Infer waiting for the test's answer.
type fakeCall struct {
	inputs json.RawMessage
	answer chan fakeAnswer
	stream backend.Stream     // the Infer's, as a streaming model's client would tell it
	meter  backend.TokenMeter // the Infer's, as an OpenAI model's client would tell it
	route  string             // the Infer's route (backend.Request.Route)
}

type fakeAnswer struct {
	out json.RawMessage
	err error
}

func (c *fakeCall) reply(out string) { c.answer <- fakeAnswer{out: json.RawMessage(out)} }
func (c *fakeCall) fail(err error)   { c.answer <- fakeAnswer{err: err} }

func (i *fakeInstance) Info() backend.Info      { return backend.Info{Pid: i.pid} }
func (i *fakeInstance) Ready() <-chan struct{}  { return i.ready }
func (i *fakeInstance) Exited() <-chan struct{} { return i.exited }

func (i *fakeInstance) ExitErr() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.exitErr
}

func (i *fakeInstance) BootProblem() backend.BootProblem {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.problem
}

func (i *fakeInstance) LastLogLine() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.lastLine
}

func (i *fakeInstance) Infer(ctx context.Context, req backend.Request) (json.RawMessage, error) {
	if i.auto {
		return i.reply, nil
	}
	c := &fakeCall{inputs: req.Inputs, answer: make(chan fakeAnswer, 1), stream: req.Stream, meter: req.Meter, route: req.Route}
	a, err := serveFake(ctx, i, i.calls, c, c.answer)
	return a.out, cmp.Or(err, a.err)
}

// serveFake hands req to the test on ch and waits for its answer, as a
// model would: a request ends with its context (unless the model ignores
// cancels) or with the process.
func serveFake[Req, Ans any](ctx context.Context, i *fakeInstance, ch chan<- Req, req Req, answer <-chan Ans) (Ans, error) {
	var none Ans
	select {
	case ch <- req:
	case <-ctx.Done():
		return none, ctx.Err()
	case <-i.exited:
		return none, i.exitedErr()
	}
	done := ctx.Done()
	if i.ignoreCancel.Load() {
		done = nil
	}
	select {
	case a := <-answer:
		return a, nil
	case <-done:
		return none, ctx.Err()
	case <-i.exited:
		return none, i.exitedErr()
	}
}

// fakeBatch is one InferBatch waiting for the test's answer.
type fakeBatch struct {
	inputs []json.RawMessage
	answer chan fakeBatchAnswer
	ctx    context.Context // the InferBatch's: done once nobody waits for it
}

type fakeBatchAnswer struct {
	items []backend.BatchItem
	err   error
}

// reply answers the batch with one item per value: an output, or, for
// "error: TEXT", the model's error for that call alone.
func (b *fakeBatch) reply(vals ...string) {
	items := make([]backend.BatchItem, len(vals))
	for i, v := range vals {
		if text, ok := strings.CutPrefix(v, "error: "); ok {
			items[i].Err = text
		} else {
			items[i].Output = json.RawMessage(v)
		}
	}
	b.answer <- fakeBatchAnswer{items: items}
}

func (b *fakeBatch) fail(err error) { b.answer <- fakeBatchAnswer{err: err} }

// sent returns the inputs of the batch as one string, "a b c".
func (b *fakeBatch) sent() string {
	parts := make([]string, len(b.inputs))
	for i, in := range b.inputs {
		parts[i] = string(in)
	}
	return strings.Join(parts, " ")
}

func (i *fakeInstance) InferBatch(ctx context.Context, inputs []json.RawMessage) ([]backend.BatchItem, error) {
	if i.auto {
		items := make([]backend.BatchItem, len(inputs))
		for k := range items {
			items[k].Output = i.reply
		}
		return items, nil
	}
	b := &fakeBatch{inputs: inputs, answer: make(chan fakeBatchAnswer, 1), ctx: ctx}
	a, err := serveFake(ctx, i, i.batches, b, b.answer)
	return a.items, cmp.Or(err, a.err)
}

func (i *fakeInstance) exitedErr() error {
	return fmt.Errorf("%w (%v)", backend.ErrExited, i.ExitErr())
}

// Stop behaves like a process that exits on SIGTERM.
func (i *fakeInstance) Stop() {
	i.stopOnce.Do(func() { close(i.stopped) })
	i.exit(errors.New("signal: terminated"), "")
	<-i.exited
}

// Measure reports what uses holds when the stretch ends.
func (i *fakeInstance) Measure() func() backend.Usage {
	return func() backend.Usage {
		if u := i.uses.Load(); u != nil {
			return *u
		}
		return backend.Usage{}
	}
}

func (i *fakeInstance) markReady() { close(i.ready) }

// exit ends the process with err (nil = exit status 0) after it printed
// line.
func (i *fakeInstance) exit(err error, line string) {
	i.exitOnce.Do(func() {
		i.mu.Lock()
		i.exitErr = err
		if line != "" {
			i.lastLine = line
		}
		i.mu.Unlock()
		close(i.exited)
	})
}

// setProblem sets what BootProblem returns.
func (i *fakeInstance) setProblem(bp backend.BootProblem) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.problem = bp
}

func (i *fakeInstance) wasStopped() bool { return isClosed(i.stopped) }
func (i *fakeInstance) hasExited() bool  { return isClosed(i.exited) }

// fakeGPUs is an Inventory of n simulated GPUs.
type fakeGPUs []gpu.Device

func simulatedGPUs(n int) fakeGPUs {
	var d fakeGPUs
	for i := range n {
		d = append(d, gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Name: "Simulated", MemoryTotalMiB: 16384, MemoryFreeMiB: 16384, Simulated: true})
	}
	return d
}

func (g fakeGPUs) Devices() []gpu.Device { return g }

// harness runs a Scheduler with fakes inside a synctest bubble. settle waits
// until every goroutine of the bubble is blocked, which is when the loop has
// handled everything that can happen without the test acting.
type harness struct {
	t      *testing.T
	s      *Scheduler
	st     *testStore
	l      *fakeBackend
	clk    *fakeClock
	cancel context.CancelFunc
	runErr chan error
}

// newHarness runs a scheduler on a fake backend with the GPUs of gpus (nil =
// none) and 8 CPU slots, or as many as gpus says when it is cpuSlots.
func newHarness(t *testing.T, cfg Config, gpus Inventory, projects ...store.Project) *harness {
	return startHarness(t, cfg, gpus, newTestStore(t, projects...))
}

func startHarness(t *testing.T, cfg Config, gpus Inventory, st *testStore) *harness {
	t.Helper()
	return startHarnessOn(t, cfg, gpus, st, nil)
}

// startHarnessOn is startHarness with the scheduler's backend made from the
// fake by wrap (nil: the fake itself), for a backend with more to it.
func startHarnessOn(t *testing.T, cfg Config, gpus Inventory, st *testStore, wrap func(*fakeBackend) backend.Backend) *harness {
	t.Helper()
	slots := 8
	if n, ok := gpus.(cpuSlots); ok {
		slots = int(n)
	}
	h := &harness{t: t, st: st, l: newFakeBackend(slots, gpus), clk: newFakeClock(), runErr: make(chan error, 1)}
	var b backend.Backend = h.l
	if wrap != nil {
		b = wrap(h.l)
	}
	h.s = New(cfg, h.st, b, h.clk, zerolog.New(refusedMoves{t}).Level(zerolog.ErrorLevel))
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.runErr <- h.s.Run(ctx) }()
	h.settle()
	return h
}

// stop ends Run and the fake store; Run must return by itself, having ended
// every goroutine it started (the synctest bubble fails the test otherwise).
func (h *harness) stop() {
	h.t.Helper()
	h.cancel()
	if err := <-h.runErr; err != nil {
		h.t.Errorf("Run: %v", err)
	}
	h.st.close()
}

// settle waits until every goroutine of the bubble is durably blocked. The
// watchdog in main_test.go ends the run if that takes longer than
// settleBound of real time, so a live-lock fails in seconds, not at the
// package's -timeout.
// refusedMoves is the harness's log: it fails the test when the loop tries a
// move of a call that the lifecycle (lifecycle.go) refuses, so every
// scheduler test checks the loop against the transition table. Other log
// lines are dropped.
type refusedMoves struct{ t *testing.T }

func (r refusedMoves) Write(line []byte) (int, error) {
	if bytes.Contains(line, []byte(msgMoveRefused)) {
		r.t.Errorf("the loop tried a call move the lifecycle refuses: %s", line)
	}
	return len(line), nil
}

func (h *harness) settle() {
	watch.begin(h.t.Name())
	synctest.Wait()
	watch.end()
}

// advance lets the scheduler catch up, then moves the clock by d.
func (h *harness) advance(d time.Duration) {
	h.settle()
	h.clk.Advance(d)
	h.settle()
}

// submit submits a call and waits for Submit to return.
func (h *harness) submit(p store.Project, inputs string) store.Call {
	h.t.Helper()
	c, err := h.s.Submit(context.Background(), p, json.RawMessage(inputs))
	if err != nil {
		h.t.Fatalf("Submit: %v", err)
	}
	h.settle()
	return c
}

// launched returns the next launched instance, failing if there is none.
func (h *harness) launched() *fakeInstance {
	h.t.Helper()
	h.settle()
	select {
	case i := <-h.l.launched:
		return i
	default:
		h.t.Fatalf("no replica was launched")
		return nil
	}
}

// launchedN returns the next n launched instances and checks no more were.
func (h *harness) launchedN(n int) []*fakeInstance {
	h.t.Helper()
	var out []*fakeInstance
	for range n {
		out = append(out, h.launched())
	}
	h.noLaunch()
	// Launches run concurrently: order them as started.
	slices.SortFunc(out, func(a, b *fakeInstance) int {
		return cmp.Or(cmp.Compare(a.spec.ProjectID, b.spec.ProjectID), cmp.Compare(len(a.spec.ReplicaID), len(b.spec.ReplicaID)), cmp.Compare(a.spec.ReplicaID, b.spec.ReplicaID))
	})
	return out
}

// noLaunch checks that no replica was launched.
// succeedOnNewReplica readies the replica launched next, has it answer
// call id, and checks that the call succeeded.
func (h *harness) succeedOnNewReplica(id string) {
	h.t.Helper()
	i := h.launched()
	h.ready(i)
	h.call(i).reply(`{}`)
	if got := h.result(id); got.State != store.CallSucceeded {
		h.t.Fatalf("call %s on a new replica = %+v", id, got)
	}
}

func (h *harness) noLaunch() {
	h.t.Helper()
	h.settle()
	select {
	case i := <-h.l.launched:
		h.t.Fatalf("unexpected launch of %s", i.spec.ReplicaID)
	default:
	}
}

// ready marks instances ready and lets the scheduler react.
func (h *harness) ready(is ...*fakeInstance) {
	for _, i := range is {
		i.markReady()
	}
	h.settle()
}

// call returns the Infer call waiting on i, failing if there is none.
func (h *harness) call(i *fakeInstance) *fakeCall {
	h.t.Helper()
	h.settle()
	select {
	case c := <-i.calls:
		return c
	default:
		h.t.Fatalf("no call reached replica %s", i.spec.ReplicaID)
		return nil
	}
}

// noCall checks that no call waits on i.
func (h *harness) noCall(i *fakeInstance) {
	h.t.Helper()
	h.settle()
	select {
	case c := <-i.calls:
		h.t.Fatalf("unexpected call %s on replica %s", c.inputs, i.spec.ReplicaID)
	default:
	}
}

// result waits for call id's done channel and returns the call as Lookup
// then reports it.
func (h *harness) result(id string) store.Call {
	h.t.Helper()
	h.settle()
	_, done, err := h.s.Lookup(id)
	if err != nil {
		h.t.Fatalf("Lookup(%s): %v", id, err)
	}
	if !isClosed(done) {
		h.t.Fatalf("call %s is not done", id)
	}
	c, _, err := h.s.Lookup(id)
	if err != nil {
		h.t.Fatalf("Lookup(%s): %v", id, err)
	}
	return c
}

// state returns call id's state as Lookup reports it.
func (h *harness) state(id string) store.CallState {
	h.t.Helper()
	h.settle()
	c, _, err := h.s.Lookup(id)
	if err != nil {
		h.t.Fatalf("Lookup(%s): %v", id, err)
	}
	return c.State
}

func (h *harness) project(id string) ProjectStatus {
	h.t.Helper()
	h.settle()
	for _, p := range h.s.Snapshot().Projects {
		if p.ID == id {
			return p
		}
	}
	h.t.Fatalf("project %s not in the snapshot", id)
	return ProjectStatus{}
}

// replicaStates returns "id:state" of the project's replicas.
func (h *harness) replicaStates(id string) []string {
	var out []string
	for _, r := range h.project(id).Replicas {
		out = append(out, r.ID+":"+r.State)
	}
	return out
}

// testProject returns a valid project; opts adjust it.
func testProject(id string, opts ...func(*store.Project)) store.Project {
	p := store.Project{
		ID:               id,
		TeamID:           "team",
		MinReplicas:      0,
		MaxReplicas:      3,
		InferenceTimeout: 300,
		IdleTimeout:      30,
		Model: store.ModelSpec{
			KeyHash:     store.HashModelKey("mk-" + id),
			Command:     []string{"python3", "serve.py", id},
			Protocol:    "http",
			Concurrency: 1,
			BootTimeout: 600,
		},
	}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func minMax(lo, hi int) func(*store.Project) {
	return func(p *store.Project) { p.MinReplicas, p.MaxReplicas = lo, hi }
}

func concurrency(n int) func(*store.Project) {
	return func(p *store.Project) { p.Model.Concurrency = n }
}

func idleTimeout(s int) func(*store.Project) {
	return func(p *store.Project) { p.IdleTimeout = s }
}

// logs makes line the instance's last log line.
func (i *fakeInstance) logs(line string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.lastLine = line
}

func stoppedCount(is []*fakeInstance) int {
	n := 0
	for _, i := range is {
		if i.wasStopped() {
			n++
		}
	}
	return n
}

// countingObserver counts the OOM kills it is told of; the rest it ignores.
type countingObserver struct {
	nopObserver
	oomKills map[string]int
}

func (o *countingObserver) ReplicaOOMKilled(project string) {
	if o.oomKills == nil {
		o.oomKills = map[string]int{}
	}
	o.oomKills[project]++
}
