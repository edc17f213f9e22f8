package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"inferd/gpu"
	"inferd/scheduler/backend"
	"inferd/store"
)

// Defaults of Config's zero fields, beside DefaultMaxQueuedBytes (the
// daemon's configuration starts from them too).
const (
	DefaultMaxQueuedPerProject = 1000
	DefaultMaxBootFailures     = 3
	DefaultRestartBackoff      = time.Second
	DefaultMaxRestartBackoff   = 30 * time.Second
)

// Config tunes the scheduler. Zero values take the defaults named per field.
// How replicas run (their logs, user, stop grace, the CPU slots and GPUs) is
// the backend's to decide, not the scheduler's.
type Config struct {
	MaxQueuedPerProject int // calls waiting per project before Submit refuses; default DefaultMaxQueuedPerProject
	// MaxQueuedBytesPerProject caps the inputs, in bytes, of the calls
	// waiting per project (see budget.go); default DefaultMaxQueuedBytes.
	MaxQueuedBytesPerProject int64
	// ReplyBytes bounds the bytes of model replies held at once, read
	// and not yet stored (limits.replyBytes, replies.go); 0: no bound.
	ReplyBytes        int64
	MaxBootFailures   int           // consecutive failed boots before queued calls fail; default DefaultMaxBootFailures
	RestartBackoff    time.Duration // first wait after a crash or failed boot, doubling; default DefaultRestartBackoff
	MaxRestartBackoff time.Duration // cap of that wait; default DefaultMaxRestartBackoff
	GPUPoll           time.Duration // while a project waits for GPU, how often free GPU memory is re-read; default 1s
	// AbortGrace is how long a replica whose call was cancelled may take to
	// be free again (its request to the model aborted) before it is
	// replaced; default 10s (serve passes replica.stopGrace).
	AbortGrace time.Duration
	// Finals, in cluster mode, tells of calls made final on any node, so
	// that Lookup of a call running on another node gives a channel closed
	// once it is final; nil on a single box (such a call has no finisher
	// there: Run has returned).
	Finals FinalFeed
	// PriorityAging is how long a queued call waits to rise one priority
	// (low → normal → high), so that low calls never starve; default 30s.
	PriorityAging time.Duration
	Observer      Observer   // told about finished calls and replica events; nil = none
	Outputs       OutputSink // told about running calls and their streamed output; nil = none
	// Share, in cluster mode, is this node's part of a project's replicas
	// as the leader placed them: its local min and max (the project's own
	// bounds are for the whole cluster), ok false when the node is not
	// placed. It is read when the loop loads a project and again on each
	// ProjectChanged (call it when the placement changes). A node runs no
	// replica of a project it is not placed on (or placed with max 0),
	// except one while calls of the project are here: calls started here
	// before the project was placed, or adopted. Nil: a single box, the
	// project's own bounds.
	Share func(projectID string) (min, max int, ok bool)
	// UsageFlush is how often the replica time no call used (boot, idle)
	// is written to the usage ledger (usage.go); default 1m. A crash
	// loses at most this much of it.
	UsageFlush time.Duration
	// TeamShare, in cluster mode, is this node's share of each team's
	// cluster-wide quotas (runningCalls, replicas, gpus, cpuSlots), leased
	// to the nodes by the leader (cluster/quota.go). The scheduler holds a
	// team to the smaller of its quota and this share, read at each
	// check; a share of 0 of a field the quota bounds allows nothing of
	// it. It returns the revision of the record the share came from, which
	// the status reports beside it (the leader's sign that the node holds
	// the team to its newest share). TeamShareChanged tells it of a new
	// share. Nil: a single box, the quota alone.
	TeamShare func(team string) (share store.Quota, rev int64)
	// Outages is told when the recovery at start-up finds the store
	// unavailable (a cluster without quorum) and when it answers again:
	// the recovery waits the outage out rather than end the node. Nil
	// tells nothing.
	Outages store.Outages
}

// recoveryRetry is the pause between the start-up recovery's tries while
// the store is unavailable.
const recoveryRetry = time.Second

func (c Config) withDefaults() Config {
	if c.MaxQueuedPerProject <= 0 {
		c.MaxQueuedPerProject = DefaultMaxQueuedPerProject
	}
	if c.MaxQueuedBytesPerProject <= 0 {
		c.MaxQueuedBytesPerProject = DefaultMaxQueuedBytes
	}
	if c.MaxBootFailures <= 0 {
		c.MaxBootFailures = DefaultMaxBootFailures
	}
	if c.RestartBackoff <= 0 {
		c.RestartBackoff = DefaultRestartBackoff
	}
	if c.MaxRestartBackoff <= 0 {
		c.MaxRestartBackoff = DefaultMaxRestartBackoff
	}
	c.MaxRestartBackoff = max(c.MaxRestartBackoff, c.RestartBackoff)
	if c.GPUPoll <= 0 {
		c.GPUPoll = time.Second
	}
	if c.AbortGrace <= 0 {
		c.AbortGrace = 10 * time.Second
	}
	if c.PriorityAging <= 0 {
		c.PriorityAging = 30 * time.Second
	}
	if c.UsageFlush <= 0 {
		c.UsageFlush = time.Minute
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Outputs == nil {
		c.Outputs = nopOutputs{}
	}
	return c
}

// Store is what the scheduler needs of a store.Store.
type Store interface {
	GetProject(id string) (store.Project, error)
	ListProjects(teamID string) ([]store.Project, error)
	// GetCallResult and CallInputs read a call's outputs (for Lookup) and
	// inputs (at dispatch) apart: a queued call keeps only its metadata in
	// memory.
	GetCallResult(id string) (store.Call, error)
	CallInputs(id string) (json.RawMessage, error)
	CallByIdempotencyKey(teamID, key string) (store.Call, error)
	PendingCalls() ([]store.Call, error)
	SaveCall(ctx context.Context, c store.Call) error
	// SaveCallAsync queues a write without blocking; writes apply in the
	// order queued and done is called once the write has committed or failed.
	SaveCallAsync(c store.Call, done func(error))
	// Teams' quotas bound what their projects hold (see tenancy.go).
	ListTeams() ([]store.Team, error)
	GetTeam(id string) (store.Team, error)
	// The usage ledger: replica time no call used is added to it
	// (usage.go), and its recent rows seed the estimates (estimate.go).
	AddUsage(rows []store.UsageRow) error
	UsageRows(teamID string, from, to time.Time) ([]store.UsageRow, error)
}

// errStopped is returned by Submit when the scheduler is not running.
var errStopped = errors.New("scheduler is not running")

// Scheduler queues inference calls and runs them on replicas of each
// project's model server. Create it with New and start it with Run; its
// methods are safe for concurrent use. See the package documentation for who
// owns what.
type Scheduler struct {
	cfg     Config
	st      Store
	backend backend.Backend
	clk     Clock
	log     zerolog.Logger

	submitc  chan startReq
	lookupc  chan lookupReq
	persistc chan persistReq
	controlc chan func() // call control (cancel, purge, warm-up): run on the loop
	snapc    chan chan Status
	livec    chan liveReq
	in       *inbox
	stopped  chan struct{} // closed when Run returns
	closedc  chan struct{} // always closed: the done channel of a finished call
	never    chan struct{} // never closed: the done channel of a call nobody will finish
	finals   *finalWaiters // cluster mode: the done channels of calls run elsewhere; nil on a single box
	started  atomic.Bool   // Run has been called
	// usageDown: the last write of replica usage found the store
	// unavailable (told to Config.Outages once, until one lands).
	usageDown atomic.Bool
	ready     atomic.Bool // the loop is serving
	draining  atomic.Bool // Drain has been called
	wg        sync.WaitGroup
	workers   inferWorkers // goroutines that run calls on replicas
	replies   *replyBudget // model replies held at once (replies.go)

	// Loop-owned: everything below is read and written only by the goroutine
	// running Run (recovery, then the loop).
	projects map[string]*project
	order    []*project       // projects sorted by id: stable iteration
	calls    map[string]*call // live calls: queued, running, or final write pending
	idem     map[string]*call // live calls started with an idempotency key, by store.IdempotencyIndexKey
	// keyReads are the idempotency keys held for a start reading the store
	// off the loop, with the starts of the same key queued behind it
	// (idempotency.go).
	keyReads map[string][]startReq
	failures recentFailures
	resave   resaveQueue    // failures to write again once the store takes writes
	results  *sharedResults // finished calls read from the store, see Lookup
	cpuUsed  int
	// releasing: holds of exited replicas on real GPUs that the driver has
	// not been read for since (see pruneReleases).
	releasing []release
	gpuPoll   timer           // armed while a project waits for GPU: re-read the inventory
	rrLast    string          // the project that got a replica last, for round-robin
	seq       uint64          // last timer seq handed out
	loading   map[string]bool // project re-read in flight → another one is needed after it
	drain     *drainState     // set once Drain has begun (drain.go)
	evbuf     []event
	scratch   []*rep
	needs     []int
	held      []assignment
	// pass says what the scheduling pass after the events in hand must
	// visit: only the projects they touched, while nothing waits (narrow.go).
	pass passScope
	// quotas are the teams' quotas (absent = unlimited); teamLoading is
	// reloadTeam's reads in flight, like loading.
	quotas      map[string]store.Quota
	teamLoading map[string]bool
	// usage is the boot and idle replica time not written yet, by hour,
	// team and project; usageT times its next write (usage.go).
	usage  map[store.UsageKey]*store.UsageRow
	usageT timer
}

type lookupReq struct {
	id    string
	reply chan lookupResult
}

type lookupResult struct {
	c     store.Call
	done  <-chan struct{}
	found bool
	// unsaved: c is a failure whose final write did not land (kept in
	// memory, recentFailures), which the store may have overtaken.
	unsaved bool
}

// New returns a Scheduler that is not running yet: call Run. Replicas run on
// b, which also says what capacity (CPU slots, GPUs) there is.
func New(cfg Config, st Store, b backend.Backend, clk Clock, log zerolog.Logger) *Scheduler {
	if clk == nil {
		clk = RealClock()
	}
	s := &Scheduler{
		cfg:      cfg.withDefaults(),
		st:       st,
		backend:  b,
		clk:      clk,
		log:      log,
		submitc:  make(chan startReq),
		lookupc:  make(chan lookupReq),
		persistc: make(chan persistReq),
		controlc: make(chan func()),
		snapc:    make(chan chan Status),
		livec:    make(chan liveReq),
		in:       newInbox(),
		stopped:  make(chan struct{}),
		closedc:  make(chan struct{}),
		never:    make(chan struct{}),
		workers:  newInferWorkers(),
		projects: map[string]*project{},
		calls:    map[string]*call{},
		idem:     map[string]*call{},
		keyReads: map[string][]startReq{},
		failures: newRecentFailures(maxRecentFailures),
		results:  newSharedResults(),
		replies:  newReplyBudget(cfg.ReplyBytes),
		loading:  map[string]bool{},

		quotas:      map[string]store.Quota{},
		teamLoading: map[string]bool{},
	}
	close(s.closedc)
	if cfg.Finals != nil {
		s.finals = newFinalWaiters()
		cfg.Finals.OnCallFinal(s.finals.final)
	}
	return s
}

// Ready reports whether the scheduler's loop is running (recovery done) and
// takes new calls (Drain has not begun).
func (s *Scheduler) Ready() bool { return s.ready.Load() && !s.draining.Load() }

// Run has the backend recover the replicas a previous run left behind and
// recovers the calls that were pending when the daemon last stopped, then
// schedules until ctx ends. Then it stops every replica (concurrently) and
// returns once every goroutine it started has ended. Calls still running are
// left as they are in the store: the next start fails them as interrupted.
// Run may be called once.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("scheduler: Run called twice")
	}
	defer close(s.stopped)
	// Before any launch, so that what a previous run left holds no GPU or
	// port a new replica is given. A cleanup that failed leaves processes
	// behind, not a broken daemon: serve on.
	if err := s.backend.Recover(ctx); err != nil {
		s.log.Warn().Err(err).Msg("replica recovery incomplete")
	}
	if err := s.recoverPending(ctx); err != nil {
		s.in.close()
		return err
	}
	s.ready.Store(true)
	s.armUsageFlush()
	s.log.Info().Msg("scheduler ready") // /readyz answers 200 from now on
	s.loop(ctx)
	return nil
}

// Lookup returns call id and a channel closed once its result is durable.
// Live calls come from the scheduler (state queued, booting or running);
// others from the store, with a closed channel when they are finished (an
// unfinished one, in cluster mode with Config.Finals, is running on another
// node: its channel closes when the feed tells it is final). An unknown
// call is store.ErrNotFound. Before Run has recovered the pending
// calls, Lookup waits for it.
func (s *Scheduler) Lookup(id string) (store.Call, <-chan struct{}, error) {
	req := lookupReq{id: id, reply: make(chan lookupResult, 1)}
	select {
	case s.lookupc <- req:
		if r := <-req.reply; r.unsaved {
			return s.lookupUnsaved(r.c)
		} else if r.found {
			return r.c, r.done, nil
		}
	case <-s.stopped:
	}
	// Lookups of one finished call share the copy of its outputs.
	c, err := s.results.get(id, s.clk.Now(), s.st.GetCallResult)
	if err != nil {
		return store.Call{}, nil, fmt.Errorf("get call %s: %w", id, err)
	}
	if !c.State.Done() {
		if s.finals != nil {
			return s.awaitElsewhere(id, c)
		}
		// Unfinished but unknown to the loop: Run has returned, and whoever
		// runs next will finish it, not this scheduler.
		return c, s.never, nil
	}
	return c, s.closedc, nil
}

// lookupUnsaved is Lookup of a call whose final write this node could not
// make (the store did not answer: no quorum, or this node cut off): its
// failure, or with durability: answered the result its client was given,
// kept in memory (recentFailures). The
// store has the last word: in cluster mode the leader may have handed the
// call to another node meanwhile, which ran it to the end, and that
// committed result is the call's on every node; this node's failure is
// never answered over it. While the store cannot say (still unavailable),
// neither can this node: the error is the store's (a 503 "cluster
// unavailable; retry"). When the store holds the call unfinished, this
// node's failure stands: the store has not had its write yet.
func (s *Scheduler) lookupUnsaved(local store.Call) (store.Call, <-chan struct{}, error) {
	stored, err := s.st.GetCallResult(local.ID)
	switch {
	case err == nil && stored.State.Done():
		return stored, s.closedc, nil
	case errors.Is(err, store.ErrUnavailable):
		return store.Call{}, nil, fmt.Errorf("get call %s: %w", local.ID, err)
	}
	return local, s.closedc, nil
}

// awaitElsewhere is Lookup of call c, unfinished and unknown to the loop,
// in cluster mode: it runs on another node (or will, once the leader hands
// it on), and the FinalFeed tells when it is final. The call is read again
// once the wait is registered: a final write told between the first read
// and the registration would otherwise wake nobody.
func (s *Scheduler) awaitElsewhere(id string, c store.Call) (store.Call, <-chan struct{}, error) {
	done := s.finals.wait(id, s.clk.Now())
	again, err := s.st.GetCallResult(id)
	switch {
	case err != nil:
		return c, done, nil // the first read stands; the wait may still end well
	case again.State.Done():
		s.finals.final(id)
		return again, s.closedc, nil
	}
	return again, done, nil
}

// ProjectChanged tells the scheduler that project id was created, updated or
// deleted. It never blocks: the scheduler re-reads the project and
// reconciles at once.
func (s *Scheduler) ProjectChanged(id string) { s.in.post(evProjectChanged{id: id}) }

// Snapshot returns the scheduler's state for the status page and metrics.
// It is empty until Run has recovered and after Run has returned.
func (s *Scheduler) Snapshot() Status {
	if !s.ready.Load() {
		return Status{CPUSlots: s.cpuSlots()}
	}
	reply := make(chan Status, 1)
	select {
	case s.snapc <- reply:
		return <-reply
	case <-s.stopped:
		return Status{CPUSlots: s.cpuSlots()}
	}
}

// LiveCalls returns up to limit of the calls the scheduler holds live, of
// team teamID ("" = every team), newest first (by id, as the store's
// RecentCalls lists them): queued, booting and running ones, a sync start's
// included before anything of it is written. It is the status page's read
// (the loop pays for it only when asked): nil before Run has recovered the
// pending calls, or once it has returned.
func (s *Scheduler) LiveCalls(teamID string, limit int) []LiveCall {
	if !s.ready.Load() || limit <= 0 {
		return nil
	}
	req := liveReq{teamID: teamID, limit: limit, reply: make(chan []LiveCall, 1)}
	select {
	case s.livec <- req:
		return <-req.reply
	case <-s.stopped:
		return nil
	}
}

// loop is the one goroutine that owns the scheduler's state.
func (s *Scheduler) loop(ctx context.Context) {
	s.schedule()
	for {
		select {
		case <-ctx.Done():
			s.shutdown()
			return
		case req := <-s.submitc:
			s.admit(req) // touches the project it queues a call in
		case req := <-s.lookupc:
			req.reply <- s.lookupLive(req.id)
			continue // reads change nothing: no scheduling pass
		case req := <-s.persistc:
			if req.c.p == nil {
				req.reply <- startResult{refused: true} // admit refused it
				continue
			}
			s.persist(req.c, s.view(req.c), req.reply)
			continue // a write of the call as it stands: nothing to schedule
		case reply := <-s.snapc:
			reply <- s.snapshot()
			continue
		case req := <-s.livec:
			req.reply <- s.liveCalls(req.teamID, req.limit)
			continue
		case fn := <-s.controlc:
			fn()
			s.pass.widen() // a control may change anything
		case <-s.in.kick:
			evs := s.in.take(s.evbuf)
			pass := s.drain != nil // a drain's pass watches the calls end
			for _, ev := range evs {
				s.handle(ev)
				switch ev.(type) {
				case evFinal:
				case evInferDone, evPersisted:
					pass = true // their handlers say what they touched
				default:
					pass = true
					s.pass.widen()
				}
			}
			// Handled: drop them now, not at the next take. An event may
			// hold a model's reply (evInferDone's out, evFinal's call),
			// which would otherwise stay live until the loop hears of
			// something else, long after the store let it go (issue 41).
			clear(evs)
			s.evbuf = evs
			if !pass {
				// Only final writes committed: their calls had left their
				// queues and replicas already, so no pass would act.
				continue
			}
		}
		s.schedule()
	}
}

// handle applies one event to the state. The scheduling pass that follows
// each batch acts on the result (dispatch, boots, idle timers).
func (s *Scheduler) handle(ev event) {
	switch ev := ev.(type) {
	case evPersisted:
		s.onPersisted(ev)
	case evFinal:
		s.onFinal(ev.c, ev.err, ev.woken, ev.answered)
	case evLaunched:
		s.onLaunched(ev)
	case evPhase:
		s.onPhase(ev)
	case evReady:
		s.onReady(ev.r)
	case evExited:
		s.onExited(ev)
	case evInferDone:
		s.onInferDone(ev)
	case evBootTimeout:
		s.onBootTimeout(ev.r, ev.seq)
	case evIdleExpired:
		s.onIdleExpired(ev.r, ev.seq)
	case evInferTimeout:
		s.onInferTimeout(ev.c, ev.seq)
	case evQueueExpired:
		s.onQueueExpired(ev.c, ev.seq)
	case evAbortGrace:
		s.onAbortGrace(ev.r, ev.seq)
	case evBackoffDone:
		ev.p.backoffT.fired(ev.seq) // the pass boots what is needed
	case evBatchDue:
		ev.p.batchT.fired(ev.seq) // the pass sends the batch
	case evBatchDone:
		s.onBatchDone(ev)
	case evGPUPoll:
		s.gpuPoll.fired(ev.seq) // the pass re-reads the inventory
	case evProjectChanged:
		s.reload(ev.id)
	case evProjectLoaded:
		s.onProjectLoaded(ev)
	case evTeamChanged:
		s.reloadTeam(ev.id)
	case evTeamShare:
		// Read at each check: the (wide) pass that follows acts on it.
	case evTeamLoaded:
		s.onTeamLoaded(ev)
	case evResaveFailed:
		s.resave.add(ev.c)
	case evDrain:
		s.onDrain(ev)
	case evDrainDeadline:
		s.onDrainDeadline(ev.reply)
	case evAdopt:
		s.onAdopt(ev)
	case evFenced:
		s.onFenced(ev.c)
	case parkEvent:
		s.onParkEvent(ev)
	case evUsageFlush:
		s.onUsageFlush(ev.seq)
	case evUsageFailed:
		s.onUsageFailed(ev.rows)
	}
}

// arm (re)starts tm to post the event built by mk after d.
func (s *Scheduler) arm(tm *timer, d time.Duration, mk func(seq uint64) event) {
	tm.stop()
	s.seq++
	seq := s.seq
	tm.seq = seq
	tm.at = s.clk.Now().Add(d)
	tm.t = s.clk.AfterFunc(d, func() { s.in.post(mk(seq)) })
}

// shutdown stops every replica and waits for every goroutine the scheduler
// started. Nothing new is written to the store from here on.
func (s *Scheduler) shutdown() {
	s.ready.Store(false)
	// Events that arrive from now on are handled by their posters (see each
	// post call); these few were posted before the inbox closed.
	for _, ev := range s.in.close() {
		switch ev := ev.(type) {
		case evLaunched:
			if ev.err == nil {
				s.goStop(ev.inst)
			}
		case evFinal:
			if !ev.woken {
				close(ev.c.done)
			}
		case evPersisted:
			ev.reply <- persistedResult(ev.answer, ev.err)
		}
	}
	s.gpuPoll.stop()
	s.usageT.stop()
	s.flushUsageAtShutdown()
	for _, p := range s.order {
		p.backoffT.stop()
		p.batchT.stop()
		for _, r := range p.replicas {
			r.boot.stop()
			r.idleT.stop()
			r.abortT.stop()
			r.park.stop()
			if r.inst != nil && r.state != stateStopping {
				r.state = stateStopping
				s.goStop(r.inst)
			}
		}
	}
	for _, c := range s.calls {
		c.timeout.stop()
		c.expiry.stop()
		if c.cancel != nil {
			c.cancel()
		}
	}
	s.stopWorkers()
	s.wg.Wait()
}

// goStop stops inst in a goroutine of its own: Stop takes up to the
// backend's grace period.
func (s *Scheduler) goStop(inst backend.Instance) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		inst.Stop()
	}()
}

// recoverPending re-queues the calls that were queued when the daemon last
// stopped and fails those that were running: their replica died with it.
func (s *Scheduler) recoverPending(ctx context.Context) error {
	// The reads first, together: they are tried again while the store is
	// unavailable (a node of a cluster that lost quorum as it started),
	// and nothing is changed until all three have answered.
	var projects []store.Project
	var teams []store.Team
	var pending []store.Call
	err := store.UntilAnswered(ctx, recoveryRetry, "recover pending calls", s.cfg.Outages, func() (err error) {
		if projects, err = s.st.ListProjects(""); err != nil {
			return fmt.Errorf("list projects: %w", err)
		}
		if teams, err = s.st.ListTeams(); err != nil {
			return fmt.Errorf("list teams: %w", err)
		}
		if pending, err = s.st.PendingCalls(); err != nil {
			return fmt.Errorf("pending calls: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range projects {
		s.addProject(p)
	}
	for _, t := range teams {
		s.quotas[t.ID] = t.Quota
	}
	now := s.clk.Now()
	var writes []store.Call // calls changed by recovery, to write before serving
	var retried int
	for _, c := range pending {
		if w, ok := s.recoverCall(c, s.projects[c.ProjectID], now); ok {
			writes = append(writes, w)
			if w.State == store.CallQueued {
				retried++
			}
		}
	}
	for _, p := range s.order {
		s.checkGPUs(p)
	}
	// One async write each shares commits; waiting for all keeps "recovery
	// first": nobody reads a call as running that the daemon already gave up
	// (or is about to run again).
	type saved struct {
		id  string
		err error
	}
	errs := make(chan saved, len(writes))
	for _, c := range writes {
		s.st.SaveCallAsync(c, func(err error) { errs <- saved{c.ID, err} })
	}
	for range writes {
		select {
		case r := <-errs:
			switch {
			case errors.Is(r.err, store.ErrFenced):
				// Handed to another node while this one restarted (cluster
				// mode): it is not this node's to run.
				if c := s.calls[r.id]; c != nil {
					s.log.Warn().Err(r.err).Str("call", r.id).Msg(msgDiscarded)
					s.abandon(c)
				}
			case r.err != nil:
				s.log.Error().Err(r.err).Msg("recovery: saving an interrupted call failed")
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if len(pending) > 0 {
		s.log.Info().Int("requeued", len(pending)-len(writes)+retried).Int("retried", retried).
			Int("failed", len(writes)-retried).Msg("recovered pending calls")
	}
	return nil
}

// devices is the backend's GPUs.
func (s *Scheduler) devices() []gpu.Device { return s.backend.Capacity().GPUs }

// cpuSlots is how many CPU replicas the backend runs at once.
func (s *Scheduler) cpuSlots() int { return s.backend.Capacity().CPUSlots }

// ms is d in whole milliseconds.
func ms(d time.Duration) int64 { return d.Milliseconds() }
