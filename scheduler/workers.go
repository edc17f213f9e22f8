package scheduler

import (
	"context"
	"encoding/json"
	"time"

	"inferd/scheduler/backend"
)

// workerIdle is how long an idle inference worker waits for another call
// before it exits, so that a quiet daemon keeps none.
const workerIdle = 5 * time.Second

// inferJob is one call to run on its replica (the arguments of infer).
type inferJob struct {
	ctx    context.Context
	c      *call
	id     string // c's id, for reading its inputs off the loop
	r      *rep
	inst   backend.Instance
	inputs json.RawMessage // nil: read them from the store
	// A batch (batch.go) has b and its calls' inputs in batch instead of
	// c, id and inputs.
	b     *batch
	batch []batchInput
}

// inferWorkers runs calls on goroutines that are kept for the next call,
// rather than one new goroutine per call: a new goroutine starts with a small
// stack and grew it, copying it two or three times, in every call through
// net/http's client (4.5% of the daemon's CPU at concurrency 64). A worker
// takes another job only while idle and exits after workerIdle without one,
// or at shutdown. Workers are counted in the scheduler's wg.
type inferWorkers struct {
	jobs chan inferJob // unbuffered: a send succeeds only to an idle worker
	quit chan struct{} // closed when the loop ends: idle workers exit
}

func newInferWorkers() inferWorkers {
	return inferWorkers{jobs: make(chan inferJob), quit: make(chan struct{})}
}

// runInfer hands j to an idle worker, or starts one for it. Only the loop calls
// run, and never after stop.
func (s *Scheduler) runInfer(j inferJob) {
	select {
	case s.workers.jobs <- j:
		return
	default:
	}
	s.wg.Add(1)
	go s.inferWorker(j)
}

func (s *Scheduler) inferWorker(j inferJob) {
	defer s.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		s.infer(j.ctx, j)
		j = inferJob{} // keep no call alive while idle
		idle.Reset(workerIdle)
		select {
		case j = <-s.workers.jobs:
		case <-idle.C:
			return
		case <-s.workers.quit:
			return
		}
	}
}

// stopWorkers makes idle workers exit; busy ones exit after their call.
func (s *Scheduler) stopWorkers() { close(s.workers.quit) }
