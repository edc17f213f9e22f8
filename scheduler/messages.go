package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"inferd/scheduler/backend"
	"inferd/store"
)

// ending is how the scheduler ends a call: the message a check of it shows
// and, for a failure, its kind (store.Failure), decided together where the
// call ends, so that no answer reads the kind back out of the message.
type ending struct {
	msg  string
	fail *store.Failure // nil: the call succeeded
}

// succeeded ends a call that has its result.
var succeeded = ending{msg: msgSuccess}

// failed ends a call as failed of kind with message msg.
func failed(kind store.FailureKind, msg string) ending {
	return ending{msg: msg, fail: &store.Failure{Kind: kind}}
}

// The user-facing texts of the calls the scheduler ends. Clients see them as
// the call's message, so each says what happened; README.md ("Errors you may
// see") and docs/protocols.md list them.
const (
	msgSuccess        = "success"
	msgInterrupted    = "error: interrupted by a server restart"
	msgProjectDeleted = "error: project deleted"
	msgStorageFull    = "error: storage full: the result could not be saved"
	// Cluster mode: etcd did not take the result within the store's bound.
	msgResultUnavailable = "error: cluster unavailable: the result could not be saved; start the call again"
	// The inputs of a durable call could not be read back at dispatch.
	msgInputsUnreadable = "error: the call's inputs could not be read from storage; start it again"
)

// ErrQueueFull is wrapped by Submit's error when the project's queue is at
// its bound. The error's text is the client message without "error: ".
var ErrQueueFull = errors.New("queue full")

// ErrNeedsGPUs is wrapped by Submit's error when the project asks for more
// GPUs per replica than the machine has, so its calls could never run.
var ErrNeedsGPUs = errors.New("project needs more GPUs than this machine has")

// queueFullError says how many calls wait, e.g.
// "queue full (1000 calls waiting); retry later".
type queueFullError struct{ waiting int }

func (e *queueFullError) Error() string {
	return fmt.Sprintf("queue full (%d calls waiting); retry later", e.waiting)
}

func (e *queueFullError) Unwrap() error { return ErrQueueFull }

// needsGPUsError: "project needs 2 GPUs, this machine has 1", or for a
// share by memory "project needs 1 GPUs with 20000 MiB, this machine has 0
// that large".
type needsGPUsError struct {
	need, have int
	memoryMiB  uint64 // per GPU; 0 = whole GPUs
	unhealthy  int    // GPUs not counted in have because they are lost or unreadable
}

func (e *needsGPUsError) Error() string {
	msg := fmt.Sprintf("project needs %d GPUs, this machine has %d", e.need, e.have)
	if e.memoryMiB > 0 {
		msg = fmt.Sprintf("project needs %d GPUs with %d MiB, this machine has %d that large", e.need, e.memoryMiB, e.have)
	}
	if e.unhealthy > 0 {
		msg += fmt.Sprintf(" (and %d unhealthy: see /v1/status/gpus)", e.unhealthy)
	}
	return msg
}

func (e *needsGPUsError) Unwrap() error { return ErrNeedsGPUs }

// msgNeedsGPUs ends the queued calls of a project that was changed to need
// more GPUs than the machine has.
func msgNeedsGPUs(err error) string {
	return "error: " + err.Error()
}

func msgInferenceTimeout(seconds int) string {
	return fmt.Sprintf("error: inference timed out after %ds", seconds)
}

// msgStoppedForTimeout ends the calls that were running on a replica beside
// one that timed out: the replica is stopped, since it may be wedged.
func msgStoppedForTimeout(seconds int) string {
	return fmt.Sprintf("error: the replica was stopped because another call on it timed out after %ds; retry this call", seconds)
}

// msgFailedToStart ends the queued calls of a project whose replicas failed
// to boot (see bootFailed); reason says why (bootfail.go).
func msgFailedToStart(reason string) string {
	return "error: model failed to start: " + reason
}

// msgExited fails the calls a replica was running when its process exited:
// out of memory, when the kernel killed it for its project's memoryMiB.
func msgExited(exitErr error) string {
	var oom *backend.OutOfMemoryError
	if errors.As(exitErr, &oom) {
		return fmt.Sprintf("error: model ran out of memory (limit %d MiB)", oom.LimitMiB)
	}
	return fmt.Sprintf("error: model process exited (%s) during inference", exitStatus(exitErr))
}

// exitStatus is how a process ended, as exec says it ("exit status 1",
// "signal: killed"); nil means it exited cleanly.
func exitStatus(exitErr error) string {
	if exitErr == nil {
		return "exit status 0"
	}
	return exitErr.Error()
}

// msgRequestFailed ends a call whose request to the model broke without
// an answer (the connection refused, reset or cut). Which error it was is
// logged, not shown: its text names the replica's address, which is
// inferd's own business (docs/openai.md).
const msgRequestFailed = "error: model request failed: the connection to the model broke; retry"

// inferFailure maps an error of backend.Instance.Infer to how the call
// ends. exited says whether the process had exited by the time Infer
// returned, which turns any transport error into the exit message. A
// broken request is logged here with the call's id (one of a batch's).
func (s *Scheduler) inferFailure(id string, err error, exited bool, exitErr error) ending {
	var httpErr *backend.HTTPError
	var excErr *backend.ExceptionError
	switch {
	case errors.As(err, &httpErr):
		e := failed(store.FailModelStatus, fmt.Sprintf("error: model returned HTTP %d", httpErr.Status))
		e.fail.Status, e.fail.RetryAfter = httpErr.Status, httpErr.RetryAfter
		if body := strings.TrimSpace(httpErr.Body); body != "" {
			e.msg += ": " + body
			e.fail.Body = body
		}
		return e
	case errors.As(err, &excErr):
		return failed(store.FailModel, "error: model raised an exception: "+excErr.LastLine)
	case errors.Is(err, backend.ErrInvalidReply):
		detail := strings.TrimPrefix(err.Error(), backend.ErrInvalidReply.Error())
		detail = strings.TrimPrefix(detail, ": ")
		return failed(store.FailModel, "error: model returned an invalid reply: "+detail)
	case exited || errors.Is(err, backend.ErrExited):
		return failed(store.FailModel, msgExited(exitErr))
	case errors.Is(err, context.Canceled):
		// Aborted by the loop (a cancel, a timeout), which has ended the
		// call its own way already: this ending is never used.
		return failed(store.FailModel, msgRequestFailed)
	default:
		s.log.Warn().Err(err).Str("call", id).Msg("model request failed")
		return failed(store.FailModel, msgRequestFailed)
	}
}

// batchFailed is e, the failure of a request that carried a batch of n
// calls (a model error, a wrong count of outputs, a crash, a timeout),
// saying that it ended every call of the batch.
func batchFailed(e ending, n int) ending {
	e.msg = fmt.Sprintf("%s (the whole batch of %d calls failed)", e.msg, n)
	return e
}

// msgBatchItemFailed fails one call of a batch that the model answered
// with {"error": text} for it alone.
func msgBatchItemFailed(text string) string {
	return "error: model returned an error for this call: " + text
}
