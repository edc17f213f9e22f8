package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// Errors as backend.Instance.Infer returns them.
var (
	replicaHTTPError500 = backend.HTTPError{Status: 500, Body: "boom\n"}
	replicaException    = backend.ExceptionError{LastLine: "ValueError: bad input"}
	errInvalidReply     = fmt.Errorf("%w: reply is not JSON: %q", backend.ErrInvalidReply, "nope")
)

func TestSubmitRunsCallOnNewReplicaAndRecordsResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("echo")
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()

		c := h.submit(p, `{"x":1}`)
		if c.State != store.CallQueued || !strings.HasPrefix(c.ID, "call_") || c.ProjectID != "echo" || c.TeamID != "team" {
			t.Fatalf("Submit returned %+v", c)
		}
		if got := h.st.states(c.ID); !slices.Equal(got, []store.CallState{store.CallQueued}) {
			t.Fatalf("writes after Submit = %v, want the created write committed", got)
		}
		i := h.launched()
		want := []string{"echo-1", "echo", "team"}
		if got := []string{i.spec.ReplicaID, i.spec.ProjectID, i.spec.TeamID}; !slices.Equal(got, want) {
			t.Errorf("spec replica, project, team = %q, want %q", got, want)
		}
		if !slices.Equal(i.spec.Model.Command, p.Model.Command) || i.spec.Model.KeyHash != "" || len(i.spec.GPUs) != 0 {
			t.Errorf("spec = %+v", i.spec)
		}
		h.clk.Advance(2 * time.Second) // the boot
		h.ready(i)
		fc := h.call(i)
		if string(fc.inputs) != `{"x":1}` {
			t.Errorf("model got %s", fc.inputs)
		}
		h.clk.Advance(500 * time.Millisecond) // the inference
		fc.reply(`{"y":2}`)

		got := h.result(c.ID)
		if got.State != store.CallSucceeded || got.Message != "success" || string(got.Outputs) != `{"y":2}` {
			t.Fatalf("result = %+v", got)
		}
		if got.ReplicaID != "echo-1" || got.Attempt != 1 || got.QueueMs != 2000 || got.BootMs != 2000 || got.RunMs != 500 {
			t.Errorf("replica %q attempt %d queue %d boot %d run %d ms", got.ReplicaID, got.Attempt, got.QueueMs, got.BootMs, got.RunMs)
		}
		if got.Dispatched.IsZero() || got.Finished.IsZero() {
			t.Errorf("timestamps not set: %+v", got)
		}
		want2 := []store.CallState{store.CallQueued, store.CallRunning, store.CallSucceeded}
		if got := h.st.states(c.ID); !slices.Equal(got, want2) {
			t.Errorf("writes = %v, want %v", got, want2)
		}
	})
}

func TestReadyReplicaTakesCallWithoutBootTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("echo", minMax(1, 3))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.clk.Advance(time.Minute)
		c := h.submit(p, `{}`)
		h.call(i).reply(`1`)
		if got := h.result(c.ID); got.BootMs != 0 || got.QueueMs != 0 || got.State != store.CallSucceeded {
			t.Errorf("result = %+v, want no boot or queue time", got)
		}
		h.noLaunch()
	})
}

func TestSubmitRejectsCallWhenQueueIsFull(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
		want  string
	}{
		{"default bound", 0, "queue full (1000 calls waiting); retry later"},
		{"configured bound", 2, "queue full (2 calls waiting); retry later"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("slow", minMax(0, 1))
				h := newHarness(t, Config{MaxQueuedPerProject: tc.limit}, nil, p)
				defer h.stop()
				n := tc.limit
				if n == 0 {
					n = 1000
				}
				for range n {
					if _, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`)); err != nil {
						t.Fatalf("Submit: %v", err)
					}
				}
				_, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`))
				if !errors.Is(err, ErrQueueFull) || err.Error() != tc.want {
					t.Fatalf("Submit error = %v, want %q wrapping ErrQueueFull", err, tc.want)
				}
				if got := h.project("slow").Queued; got != n {
					t.Errorf("queued = %d, want %d", got, n)
				}
			})
		})
	}
}

func TestSubmitRejectsProjectNeedingMoreGPUsThanMachineHas(t *testing.T) {
	for _, tc := range []struct {
		name string
		gpus Inventory
		want string
	}{
		{"no GPU at all", nil, "project needs 2 GPUs, this machine has 0"},
		{"too few GPUs", simulatedGPUs(1), "project needs 2 GPUs, this machine has 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("big", func(p *store.Project) { p.Model.GPUs = 2 })
				h := newHarness(t, Config{}, tc.gpus, p)
				defer h.stop()
				_, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`))
				if !errors.Is(err, ErrNeedsGPUs) || err.Error() != tc.want {
					t.Fatalf("Submit error = %v, want %q wrapping ErrNeedsGPUs", err, tc.want)
				}
				h.noLaunch()
			})
		})
	}
}

func TestMinReplicasBootAtStartAndAreNeverTimedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("warm", minMax(2, 4), idleTimeout(0))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		is := h.launchedN(2)
		if is[0].spec.ReplicaID != "warm-1" || is[1].spec.ReplicaID != "warm-2" {
			t.Errorf("ids = %s, %s", is[0].spec.ReplicaID, is[1].spec.ReplicaID)
		}
		if got := h.replicaStates("warm"); !slices.Equal(got, []string{"warm-1:booting", "warm-2:booting"}) {
			t.Errorf("replicas = %v", got)
		}
		h.ready(is...)
		h.advance(24 * time.Hour)
		if stoppedCount(is) != 0 {
			t.Fatal("a minReplicas replica was stopped")
		}
		if got := h.replicaStates("warm"); !slices.Equal(got, []string{"warm-1:ready", "warm-2:ready"}) {
			t.Errorf("replicas = %v", got)
		}
		for _, r := range h.project("warm").Replicas {
			if !r.IdleExpiry.IsZero() || r.IdleSince.IsZero() || r.Pid == 0 {
				t.Errorf("replica status = %+v, want idle since set, no expiry, a pid", r)
			}
		}
	})
}

func TestBurstScalesUpToMaxReplicasAndNoFurther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("burst", minMax(0, 3))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		for range 10 {
			h.submit(p, `{}`)
		}
		is := h.launchedN(3)
		h.ready(is...)
		for _, i := range is {
			h.call(i)
		}
		ps := h.project("burst")
		if ps.Queued != 7 || ps.Running != 3 || len(ps.Replicas) != 3 {
			t.Errorf("queued %d running %d replicas %d, want 7, 3, 3", ps.Queued, ps.Running, len(ps.Replicas))
		}
		h.noLaunch()
	})
}

func TestConcurrencyPacksCallsOnOneReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("packed", minMax(0, 3), concurrency(4))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		for range 3 {
			h.submit(p, `{}`)
		}
		i1 := h.launchedN(1)[0]
		h.ready(i1)
		for range 3 {
			h.call(i1)
		}
		// Two more: the fourth fits on the first replica, the fifth needs a
		// second one (ceil(5/4) = 2).
		h.submit(p, `{}`)
		h.submit(p, `{}`)
		h.call(i1)
		i2 := h.launchedN(1)[0]
		h.ready(i2)
		h.call(i2)
		got := h.project("packed")
		if got.Replicas[0].InFlight != 4 || got.Replicas[1].InFlight != 1 || got.Replicas[0].State != "busy" {
			t.Errorf("replicas = %+v", got.Replicas)
		}
	})
}

func TestIdleTimeoutStopsReplicasAboveMinOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("idle", minMax(1, 3), idleTimeout(30))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i1 := h.launched()
		h.ready(i1)
		var calls []store.Call
		for range 3 {
			calls = append(calls, h.submit(p, `{}`))
		}
		is := append([]*fakeInstance{i1}, h.launchedN(2)...)
		h.ready(is[1:]...)
		for _, i := range is {
			h.call(i).reply(`{}`)
		}
		for _, c := range calls {
			h.result(c.ID)
		}
		for _, r := range h.project("idle").Replicas {
			if r.IdleExpiry.IsZero() {
				t.Errorf("replica %s has no idle expiry while above min", r.ID)
			}
		}
		h.advance(29 * time.Second)
		if n := stoppedCount(is); n != 0 {
			t.Fatalf("%d replicas stopped before the idle timeout", n)
		}
		h.advance(time.Second)
		if n := stoppedCount(is); n != 2 {
			t.Fatalf("%d replicas stopped at the idle timeout, want 2", n)
		}
		h.advance(time.Hour)
		ps := h.project("idle")
		if n := stoppedCount(is); n != 2 || len(ps.Replicas) != 1 || !ps.Replicas[0].IdleExpiry.IsZero() {
			t.Errorf("stopped %d, replicas %+v; want the min replica kept with no expiry", n, ps.Replicas)
		}
	})
}

func TestIdleTimeoutZeroStopsReplicaAsSoonAsIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("eager", idleTimeout(0))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		i := h.launched()
		h.ready(i)
		h.call(i).reply(`{}`)
		h.result(c.ID)
		if !i.wasStopped() || len(h.project("eager").Replicas) != 0 {
			t.Error("idle replica above min not stopped at once with idleTimeout 0")
		}
	})
}

func TestInferenceTimeoutFailsCallAndReplacesReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("hang", minMax(1, 1), func(p *store.Project) { p.InferenceTimeout = 5 })
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i1 := h.launched()
		h.ready(i1)
		c := h.submit(p, `{}`)
		h.call(i1) // never answered
		h.advance(4 * time.Second)
		if got := h.state(c.ID); got != store.CallRunning {
			t.Fatalf("state before the timeout = %s", got)
		}
		h.advance(time.Second)
		got := h.result(c.ID)
		if got.State != store.CallFailed || got.Message != "error: inference timed out after 5s" {
			t.Fatalf("result = %s %q", got.State, got.Message)
		}
		if !i1.wasStopped() {
			t.Error("timed-out replica not stopped")
		}
		i2 := h.launched() // min 1: replaced
		h.ready(i2)
		c2 := h.submit(p, `{}`)
		h.call(i2).reply(`"ok"`)
		if got := h.result(c2.ID); got.State != store.CallSucceeded {
			t.Errorf("call on the replacement = %+v", got)
		}
	})
}

// A replica running several calls is stopped when one of them times out;
// the others end with a message that says why, not as a model crash.
func TestInferenceTimeoutTellsTheReplicasOtherCallsWhy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("busy", minMax(1, 1), func(p *store.Project) {
			p.InferenceTimeout = 5
			p.Model.Concurrency = 2
		})
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		slow := h.submit(p, `{}`)
		h.call(i) // never answered
		h.advance(3 * time.Second)
		other := h.submit(p, `{}`)
		h.call(i) // still running when the first times out
		h.advance(2 * time.Second)
		if got := h.result(slow.ID); got.Message != "error: inference timed out after 5s" {
			t.Errorf("timed-out call: %q", got.Message)
		}
		got := h.result(other.ID)
		if want := "error: the replica was stopped because another call on it timed out after 5s; retry this call"; got.State != store.CallFailed || got.Message != want {
			t.Errorf("other call = %s %q, want %q", got.State, got.Message, want)
		}
	})
}

func TestInferenceTimeoutChangeAppliesToNextDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("t", minMax(1, 1), func(p *store.Project) { p.InferenceTimeout = 100 })
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		p.InferenceTimeout = 2
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		h.settle()
		c := h.submit(p, `{}`)
		h.call(i)
		h.advance(2 * time.Second)
		if got := h.result(c.ID); got.Message != "error: inference timed out after 2s" {
			t.Errorf("message = %q", got.Message)
		}
	})
}

func TestModelCrashMidCallFailsCallWithExitStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("crash")
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		i := h.launched()
		h.ready(i)
		h.call(i)
		i.exit(errors.New("signal: killed"), "Killed")
		got := h.result(c.ID)
		if want := "error: model process exited (signal: killed) during inference"; got.State != store.CallFailed || got.Message != want {
			t.Fatalf("result = %s %q, want %q", got.State, got.Message, want)
		}
		ps := h.project("crash")
		if len(ps.Replicas) != 0 || !strings.Contains(ps.LastError, "crash-1 exited (signal: killed)") || ps.LastErrorReplica != "crash-1" {
			t.Errorf("after the crash: replicas %v, last error %q of replica %q", ps.Replicas, ps.LastError, ps.LastErrorReplica)
		}
	})
}

func TestModelOutOfMemoryFailsCallWithTheLimitAndIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("big", func(p *store.Project) { p.Model.MemoryMiB = 200 })
		obs := &countingObserver{}
		h := newHarness(t, Config{Observer: obs}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		i := h.launched()
		h.ready(i)
		h.call(i)
		i.exit(&backend.OutOfMemoryError{LimitMiB: 200, Err: errors.New("signal: killed")}, "Killed")
		got := h.result(c.ID)
		if want := "error: model ran out of memory (limit 200 MiB)"; got.State != store.CallFailed || got.Message != want {
			t.Fatalf("result = %s %q, want %q", got.State, got.Message, want)
		}
		if ps := h.project("big"); ps.OOMKills != 1 || !strings.Contains(ps.LastError, "out of memory (limit 200 MiB)") {
			t.Errorf("status: oomKills %d, last error %q", ps.OOMKills, ps.LastError)
		}
		if obs.oomKills["big"] != 1 {
			t.Errorf("observer told of %d OOM kills, want 1", obs.oomKills["big"])
		}
		// The next call boots a fresh replica.
		c2 := h.submit(p, `{}`)
		h.advance(time.Minute) // past the restart backoff
		i2 := h.launched()
		h.ready(i2)
		h.call(i2).reply(`{"ok": true}`)
		if got := h.result(c2.ID); got.State != store.CallSucceeded {
			t.Fatalf("the call after the OOM kill: %s %q", got.State, got.Message)
		}
	})
}

// An Infer's error becomes the call's message and its failure kind, both
// kept in its record; a broken connection's Go error text (which names the
// replica's address) is never either.
func TestInferErrorsBecomeClientMessagesAndKinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
		how  store.Failure
	}{
		{"http status", &replicaHTTPError500, "error: model returned HTTP 500: boom", store.Failure{Kind: store.FailModelStatus, Status: 500, Body: "boom"}},
		{"http status with Retry-After", &backend.HTTPError{Status: 429, Body: "slow down", RetryAfter: "7"}, "error: model returned HTTP 429: slow down",
			store.Failure{Kind: store.FailModelStatus, Status: 429, Body: "slow down", RetryAfter: "7"}},
		{"invalid reply", errInvalidReply, `error: model returned an invalid reply: reply is not JSON: "nope"`, store.Failure{Kind: store.FailModel}},
		{"exception", &replicaException, "error: model raised an exception: ValueError: bad input", store.Failure{Kind: store.FailModel}},
		{"transport", errors.New(`infer: Post "http://127.0.0.1:8000/": connection reset`), msgRequestFailed, store.Failure{Kind: store.FailModel}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("m", minMax(1, 1))
				h := newHarness(t, Config{}, nil, p)
				defer h.stop()
				i := h.launched()
				h.ready(i)
				c := h.submit(p, `{}`)
				h.call(i).fail(tc.err)
				if got := h.result(c.ID); got.State != store.CallFailed || got.Message != tc.want {
					t.Errorf("result = %s %q, want %q", got.State, got.Message, tc.want)
				}
				if stored, _ := h.st.call(c.ID); store.FailureOf(stored) != tc.how || stored.Failure == nil {
					t.Errorf("stored failure = %+v, want %+v", stored.Failure, tc.how)
				}
				if i.wasStopped() {
					t.Error("a model error stopped the replica")
				}
			})
		})
	}
}

func TestBootTimeoutFailsQueuedCallsAtOnceSayingWhatTheModelDid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("stuck", func(p *store.Project) { p.Model.BootTimeout = 10 })
		h := newHarness(t, Config{MaxBootFailures: 3, RestartBackoff: 4 * time.Second}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		i := h.launched()
		i.logs("loading weights from /models/big.bin")
		i.setProblem(backend.BootProblem{Text: "GET /healthz answered 503"})
		h.advance(10*time.Second - time.Millisecond)
		if i.wasStopped() {
			t.Fatal("boot stopped before its timeout")
		}
		h.advance(time.Millisecond)
		if !i.wasStopped() {
			t.Fatal("boot not stopped at its timeout")
		}
		// One timeout is enough: the next boot of the same spec would wait
		// as long again.
		got := h.result(c.ID)
		want := "error: model failed to start: not ready after bootTimeout 10s: GET /healthz answered 503; last output: loading weights from /models/big.bin"
		if got.Message != want || store.FailureOf(got).Kind != store.FailNotStarted {
			t.Fatalf("message = %q (%+v), want %q", got.Message, got.Failure, want)
		}
		if ps := h.project("stuck"); ps.LastError != strings.TrimPrefix(want, "error: ") {
			t.Errorf("last error = %q", ps.LastError)
		}
		// While the backoff runs, a new call fails at once with the reason.
		_, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`))
		if !errors.Is(err, ErrBootFailed) || !strings.HasPrefix(err.Error(), strings.TrimPrefix(want, "error: ")+" (next boot in 4s") {
			t.Fatalf("Submit during the backoff: %v", err)
		}
		h.noLaunch()
		// Once it ends, a call tries again.
		h.advance(4 * time.Second)
		h.succeedOnNewReplica(h.submit(p, `{}`).ID)
	})
}

func TestFatalBootProblemFailsQueuedCallsWithoutRetrying(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("wrongport")
		h := newHarness(t, Config{MaxBootFailures: 3, RestartBackoff: time.Second}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		i := h.launched()
		why := "no answer on 127.0.0.1:41000 (the model must listen on $PORT); it listens on 5000"
		i.setProblem(backend.BootProblem{Text: why, Fatal: true})
		i.exit(errors.New("signal: terminated"), "listening on 5000")
		if got := h.result(c.ID); got.Message != "error: model failed to start: "+why+"; last output: listening on 5000" {
			t.Fatalf("message = %q; want the finding and the model's last line", got.Message)
		}
		h.noLaunch()
	})
}

// While a replica boots, a queued call's waitingFor says what its health
// checks find, so a model whose health path answers 501 is seen for what it
// is before the boot fails.
func TestWaitingForABootSaysWhatTheHealthChecksFind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("noget")
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		i := h.launched()
		i.setProblem(backend.BootProblem{Text: "GET /healthz answered 501 (set healthPath)"})
		h.advance(time.Second)
		h.waits(c.ID, WaitBooting, "replica booting (1.0 s so far); last check: GET /healthz answered 501 (set healthPath)", -1)
		// A finding that says error is left out: a pending text never does.
		i.setProblem(backend.BootProblem{Text: "GET /healthz failed: connection reset (error 104)"})
		h.waits(c.ID, WaitBooting, "replica booting (1.0 s so far)", -1)
	})
}

func TestCallsWaitingOnFailedBootsSayWhichAttemptAndWhy(t *testing.T) {
	for _, tc := range []struct {
		name, exit, line, want string
	}{
		{"exit with a line", "exit status 1", "loading shards", "booting (attempt 2 of 3; last: process exited with status 1)"},
		{"exit without output", "exit status 1", "", "booting (attempt 2 of 3; last: process exited with status 1 and printed nothing)"},
		// Clients take any message with "error" for a failure.
		{"reason that says error", "exit status 1 (Error 42)", "", "booting (attempt 2 of 3; last: the model did not get ready)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("flaky")
				h := newHarness(t, Config{MaxBootFailures: 3, RestartBackoff: time.Second}, nil, p)
				defer h.stop()
				c := h.submit(p, `{}`)
				h.launched().exit(errors.New(tc.exit), tc.line)
				check := func(when string) {
					t.Helper()
					h.settle()
					got, _, err := h.s.Lookup(c.ID)
					if err != nil || got.State != store.CallBooting || got.Message != tc.want {
						t.Fatalf("%s: %s %q (%v), want booting %q", when, got.State, got.Message, err, tc.want)
					}
				}
				check("during the backoff")
				if got := h.project("flaky").Waiting; got != tc.want {
					t.Errorf("status waiting = %q, want %q", got, tc.want)
				}
				h.advance(time.Second)
				i := h.launched()
				check("during the second boot")
				h.ready(i)
				h.call(i).reply(`{}`)
				if got := h.result(c.ID); got.State != store.CallSucceeded {
					t.Fatalf("result = %+v", got)
				}
			})
		})
	}
}

func TestSpecChangeEndsTheRefusalOfAFailedProject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("fixme")
		h := newHarness(t, Config{MaxBootFailures: 1, RestartBackoff: time.Minute}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		h.launched().exit(errors.New("exit status 2"), "")
		if got := h.result(c.ID); got.Message != "error: model failed to start: process exited with status 2 and printed nothing" {
			t.Fatalf("message = %q", got.Message)
		}
		if _, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`)); !errors.Is(err, ErrBootFailed) {
			t.Fatalf("Submit after the failure: %v", err)
		}
		if got, want := h.project("fixme").Waiting, "boots failed: new calls fail until the next boot in 1m0s, or until the project changes"; got != want {
			t.Errorf("status waiting = %q, want %q", got, want)
		}
		p.Model.Env = map[string]string{"FIXED": "1"}
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		h.settle()
		h.succeedOnNewReplica(h.submit(p, `{}`).ID)
	})
}

func TestExitBeforeReadyCountsAsFailedBoot(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		want       string
	}{
		{"with a log line", "ModuleNotFoundError: No module named 'torch'", "error: model failed to start: process exited with status 1: ModuleNotFoundError: No module named 'torch'"},
		{"without output", "", "error: model failed to start: process exited with status 1 and printed nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("broken")
				h := newHarness(t, Config{MaxBootFailures: 2, RestartBackoff: time.Second}, nil, p)
				defer h.stop()
				c := h.submit(p, `{}`)
				h.launched().exit(errors.New("exit status 1"), tc.line)
				h.advance(time.Second)
				h.launched().exit(errors.New("exit status 1"), tc.line)
				got := h.result(c.ID)
				if got.State != store.CallFailed || got.Message != tc.want {
					t.Fatalf("result = %s %q, want %q", got.State, got.Message, tc.want)
				}
				ps := h.project("broken")
				if ps.LastError != strings.TrimPrefix(tc.want, "error: ") {
					t.Errorf("last error = %q", ps.LastError)
				}
				// The status page links the failure to the log of the replica
				// that failed: the second one, a second after the first.
				if ps.LastErrorReplica != "broken-2" || !ps.LastErrorAt.Equal(h.clk.Now()) {
					t.Errorf("last error replica %q at %v, want broken-2 at %v", ps.LastErrorReplica, ps.LastErrorAt, h.clk.Now())
				}
			})
		})
	}
}

func TestLaunchErrorCountsAsFailedBoot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("nocmd")
		h := newHarness(t, Config{MaxBootFailures: 1}, nil, p)
		defer h.stop()
		h.l.mu.Lock()
		h.l.fail = func(spec backend.Spec) error { return fmt.Errorf("start replica %s: empty command", spec.ReplicaID) }
		h.l.mu.Unlock()
		c := h.submit(p, `{}`)
		if got := h.result(c.ID); got.Message != "error: model failed to start: start replica nocmd-1: empty command" {
			t.Errorf("message = %q", got.Message)
		}
		if st := h.s.Snapshot(); st.CPUSlotsUsed != 0 || len(st.Projects[0].Replicas) != 0 {
			t.Errorf("status after a failed launch = %+v", st)
		}
	})
}

func TestCrashRestartBackoffDoublesAndResetsOnReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("flaky", minMax(1, 1))
		h := newHarness(t, Config{MaxBootFailures: 100, RestartBackoff: time.Second, MaxRestartBackoff: 4 * time.Second}, nil, p)
		defer h.stop()
		h.launched().exit(errors.New("exit status 1"), "")
		for _, gap := range []time.Duration{1, 2, 4, 4} {
			gap *= time.Second
			h.advance(gap - time.Millisecond)
			h.noLaunch()
			h.advance(time.Millisecond)
			h.launched().exit(errors.New("exit status 1"), "")
		}
		// A replica that gets ready resets the backoff.
		h.advance(4 * time.Second)
		i := h.launched()
		h.ready(i)
		i.exit(errors.New("signal: segmentation fault"), "")
		h.advance(time.Second - time.Millisecond)
		h.noLaunch()
		h.advance(time.Millisecond)
		h.launched()
	})
}

func TestProjectChangedLowerMaxStopsSurplusIdleReplicasNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("shrink", minMax(0, 3), idleTimeout(600))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		for range 3 {
			h.submit(p, `{}`)
		}
		is := h.launchedN(3)
		h.ready(is...)
		calls := []*fakeCall{h.call(is[0]), h.call(is[1]), h.call(is[2])}
		calls[0].reply(`{}`) // is[0] idle, the others busy
		h.settle()

		p.MaxReplicas = 1
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		h.settle()
		if !is[0].wasStopped() || is[1].wasStopped() || is[2].wasStopped() {
			t.Fatalf("stopped = %v %v %v, want only the idle replica", is[0].wasStopped(), is[1].wasStopped(), is[2].wasStopped())
		}
		calls[1].reply(`{}`) // above max once idle: stopped at once
		h.settle()
		if !is[1].wasStopped() {
			t.Error("surplus replica not stopped when it became idle")
		}
		calls[2].reply(`{}`) // within max: kept until its idle timeout
		h.settle()
		if is[2].wasStopped() {
			t.Error("replica within max stopped")
		}
		h.noLaunch()
	})
}

func TestProjectChangedLowerMinStopsSurplusIdleReplicasNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("shrink", minMax(3, 3), idleTimeout(600))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		is := h.launchedN(3)
		h.ready(is...)
		p.MinReplicas = 1
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		h.settle()
		if n := stoppedCount(is); n != 2 {
			t.Errorf("%d replicas stopped, want 2", n)
		}
	})
}

func TestProjectChangedHigherMinBootsReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("grow", minMax(0, 3))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		h.noLaunch()
		p.MinReplicas = 2
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		h.launchedN(2)

		// A project created after start is picked up the same way.
		q := testProject("new", minMax(1, 1))
		h.st.putProject(q)
		h.s.ProjectChanged(q.ID)
		if i := h.launchedN(1)[0]; i.spec.ProjectID != "new" {
			t.Errorf("launched %s", i.spec.ReplicaID)
		}
	})
}

func TestProjectDeletedFailsItsCallsAndStopsItsReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("doomed", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		running := h.submit(p, `{}`)
		queued := h.submit(p, `{}`)
		h.call(i)
		h.st.deleteProject(p.ID)
		h.s.ProjectChanged(p.ID)
		h.settle()
		for _, c := range []store.Call{running, queued} {
			if got := h.result(c.ID); got.State != store.CallFailed || got.Message != "error: project deleted" {
				t.Errorf("call = %s %q", got.State, got.Message)
			}
		}
		if !i.wasStopped() {
			t.Error("replica of the deleted project not stopped")
		}
		for _, ps := range h.s.Snapshot().Projects {
			if ps.ID == p.ID {
				t.Error("deleted project still in the status")
			}
		}
		h.noLaunch()
	})
}

// A spec change rolls: the old replicas keep taking calls until replicas
// of the new spec are ready, each of which retires one old replica (an idle
// one stops, a busy one finishes its call first), so no call waits for a
// boot that a running replica could have served.
func TestModelSpecChangeRollsOntoNewReplicasBeforeOldOnesStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("v", minMax(2, 3))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		old := h.launchedN(2)
		h.ready(old...)
		c1 := h.submit(p, `{}`)
		fc1 := h.call(old[0]) // old[0] busy, old[1] idle

		p.Model.Command = []string{"python3", "serve_v2.py"}
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		h.settle()
		if old[0].wasStopped() || old[1].wasStopped() {
			t.Fatalf("busy stopped %v, idle stopped %v; want both serving until new replicas are ready", old[0].wasStopped(), old[1].wasStopped())
		}
		fresh := h.launchedN(2)
		if !slices.Equal(fresh[0].spec.Model.Command, p.Model.Command) {
			t.Errorf("new replica runs %v", fresh[0].spec.Model.Command)
		}
		previous := 0
		for _, r := range h.project("v").Replicas {
			if r.PreviousSpec {
				previous++
			}
		}
		if previous != 2 {
			t.Errorf("the status marks %d replicas as of the previous spec, want the 2 old ones", previous)
		}
		// While the new ones boot, a call goes to the old idle replica.
		c2 := h.submit(p, `{}`)
		h.call(old[1]).reply(`"v1 again"`)
		if got := h.result(c2.ID); string(got.Outputs) != `"v1 again"` {
			t.Errorf("call during the roll = %+v", got)
		}

		h.ready(fresh[0])
		if old[0].wasStopped() || !old[1].wasStopped() {
			t.Fatalf("after one new replica: busy stopped %v, idle stopped %v; want the idle one retired", old[0].wasStopped(), old[1].wasStopped())
		}
		h.ready(fresh[1])
		if old[0].wasStopped() {
			t.Fatal("the busy old replica stopped before its call ended")
		}
		c3 := h.submit(p, `{}`)
		h.noCall(old[0])
		h.call(fresh[0]).reply(`"v2"`)
		fc1.reply(`"v1"`)
		if got := h.result(c1.ID); string(got.Outputs) != `"v1"` {
			t.Errorf("call on the old replica = %+v", got)
		}
		if got := h.result(c3.ID); string(got.Outputs) != `"v2"` {
			t.Errorf("call on the new replica = %+v", got)
		}
		if !old[0].wasStopped() {
			t.Error("old replica not stopped once it finished")
		}
		h.noLaunch()
	})
}

// Where the box has no room for a new replica beside the old one, the old
// one gives way first: its calls queue for the new one, none fails.
func TestModelSpecChangeWithoutRoomStopsTheOldReplicaFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("v", minMax(1, 1))
		h := newHarness(t, Config{}, cpuSlots(1), p)
		defer h.stop()
		old := h.launched()
		h.ready(old)

		p.Model.Command = []string{"python3", "serve_v2.py"}
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		h.settle()
		if !old.wasStopped() {
			t.Fatal("the old replica holds the only CPU slot and was not stopped")
		}
		c := h.submit(p, `{}`) // queued for the new replica
		h.succeedOnNewReplica(c.ID)
	})
}

// A new spec that does not boot leaves the old replica serving: the calls
// go on being answered, none fails for the new spec's boots.
func TestModelSpecChangeThatFailsToBootKeepsTheOldReplicaServing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("v", minMax(1, 1))
		h := newHarness(t, Config{MaxBootFailures: 1, RestartBackoff: time.Second}, nil, p)
		defer h.stop()
		old := h.launched()
		h.ready(old)

		p.Model.Command = []string{"python3", "broken.py"}
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		h.launched().exit(errors.New("exit status 1"), "SyntaxError: invalid syntax")
		c := h.submit(p, `{}`)
		h.call(old).reply(`"old"`)
		if got := h.result(c.ID); got.State != store.CallSucceeded {
			t.Fatalf("call while the new spec fails to boot = %+v", got)
		}
		if old.wasStopped() {
			t.Fatal("the old replica stopped though nothing replaced it")
		}
		if got := h.project("v").LastError; !strings.Contains(got, "SyntaxError") || !strings.Contains(got, "previous spec keep serving") {
			t.Errorf("last error = %q", got)
		}
		h.advance(time.Second)
		fixed := h.launched()
		h.ready(fixed)
		if !old.wasStopped() {
			t.Error("the old replica kept running beside the new spec's ready one")
		}
	})
}

func TestRecoveryRequeuesQueuedCallsAndFailsRunningOnes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("r", minMax(0, 1))
		st := newTestStore(t, p)
		t0 := time.Date(2024, 12, 31, 23, 0, 0, 0, time.UTC)
		for _, c := range []store.Call{
			{ID: "call_q1", ProjectID: "r", State: store.CallQueued, Created: t0, Inputs: json.RawMessage(`1`)},
			{ID: "call_run", ProjectID: "r", State: store.CallRunning, Created: t0, Dispatched: t0, ReplicaID: "r-7"},
			{ID: "call_q2", ProjectID: "r", State: store.CallQueued, Created: t0.Add(time.Second), Inputs: json.RawMessage(`2`)},
			{ID: "call_orphan", ProjectID: "gone", State: store.CallQueued, Created: t0},
			{ID: "call_old", ProjectID: "r", State: store.CallSucceeded, Created: t0, Message: "success"},
		} {
			st.putCall(c)
		}
		h := startHarness(t, Config{}, nil, st)
		defer h.stop()
		if !h.s.Ready() {
			t.Fatal("not ready after recovery")
		}
		if got := h.result("call_run"); got.State != store.CallFailed || got.Message != "error: interrupted by a server restart" || got.Finished.IsZero() || store.FailureOf(got).Kind != store.FailInterrupted {
			t.Errorf("running call after restart = %+v", got)
		}
		if got := h.result("call_orphan"); got.State != store.CallFailed || got.Message != "error: project deleted" {
			t.Errorf("call of a deleted project = %+v", got)
		}
		i := h.launched()
		h.ready(i)
		fc := h.call(i)
		if string(fc.inputs) != `1` {
			t.Fatalf("first call dispatched has inputs %s, want the oldest", fc.inputs)
		}
		fc.reply(`"one"`)
		h.call(i).reply(`"two"`)
		for _, id := range []string{"call_q1", "call_q2"} {
			if got := h.result(id); got.State != store.CallSucceeded {
				t.Errorf("%s = %+v", id, got)
			}
		}
	})
}

// A node whose store has no quorum as it starts (cluster mode) waits the
// outage out: the recovery reads again until the store answers, the
// scheduler is not ready meanwhile, and then recovers as usual.
func TestRecoveryWaitsOutAnUnavailableStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("r", minMax(0, 1))
		st := newTestStore(t, p)
		st.putCall(store.Call{ID: "call_q", ProjectID: "r", State: store.CallQueued, Created: time.Now(), Inputs: json.RawMessage(`1`)})
		unavailable := fmt.Errorf("pending calls: etcd: %w", store.ErrUnavailable)
		st.pendingErrs = []error{unavailable, unavailable, unavailable}
		h := startHarness(t, Config{}, nil, st)
		defer h.stop()
		if h.s.Ready() {
			t.Fatal("ready while the store has not answered the recovery")
		}
		select {
		case err := <-h.runErr:
			t.Fatalf("Run ended with %v while the store was unavailable; want it to wait", err)
		default:
		}
		time.Sleep(3 * recoveryRetry) // the bubble's clock: the three failed tries
		h.settle()
		if !h.s.Ready() {
			t.Fatal("not ready once the store answered")
		}
		i := h.launched()
		h.ready(i)
		h.call(i).reply(`"one"`)
		if got := h.result("call_q"); got.State != store.CallSucceeded {
			t.Errorf("the call queued before the outage = %+v; want it run after", got)
		}
	})
}

// TestDoneClosesOnlyAfterFinalWriteCommits: a startOnly call's waiters
// (long polls) wake only once its result is durable, with durability:
// answered too (it relaxes only a plain sync start's own answer).
func TestDoneClosesOnlyAfterFinalWriteCommits(t *testing.T) {
	for _, durability := range []string{store.DurabilityStrict, store.DurabilityAnswered} {
		t.Run(durability, func(t *testing.T) { testDoneClosesOnlyAfterFinalWriteCommits(t, durability) })
	}
}

func testDoneClosesOnlyAfterFinalWriteCommits(t *testing.T, durability string) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("d", minMax(1, 1), func(p *store.Project) { p.Durability = durability })
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.st.setHold(func(c store.Call) bool { return c.State.Done() })
		c := h.submit(p, `{}`)
		h.call(i).reply(`{}`)
		h.settle()
		got, done, err := h.s.Lookup(c.ID)
		if err != nil || isClosed(done) || got.State != store.CallRunning {
			t.Fatalf("before the commit: %s, done closed %v, err %v; want running and open", got.State, isClosed(done), err)
		}
		h.st.release()
		h.settle()
		if !isClosed(done) {
			t.Fatal("done not closed after the final write committed")
		}
		if stored, _ := h.st.call(c.ID); stored.State != store.CallSucceeded {
			t.Errorf("stored state = %s", stored.State)
		}
	})
}

func TestFailedFinalWriteWakesWaitersWithStorageFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("full", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.st.setFail(func(c store.Call) error {
			if c.State == store.CallSucceeded {
				return errors.New("mmap: no space left on device")
			}
			return nil
		})
		c := h.submit(p, `{}`)
		_, done, _ := h.s.Lookup(c.ID)
		h.call(i).reply(`{}`)
		h.settle()
		if !isClosed(done) {
			t.Fatal("waiters not woken after a failed final write")
		}
		got, _, err := h.s.Lookup(c.ID)
		if err != nil || got.State != store.CallFailed || got.Message != "error: storage full: the result could not be saved" {
			t.Errorf("Lookup = %+v, %v", got, err)
		}

		// Once the store takes writes again, the failure is written, so a
		// restart answers the call as its waiters were told, not as
		// interrupted.
		h.st.setFail(nil)
		next := h.submit(p, `{}`)
		h.call(i).reply(`{}`)
		h.settle()
		if got := h.result(next.ID); got.State != store.CallSucceeded {
			t.Fatalf("the next call = %+v", got)
		}
		if sc, _ := h.st.call(c.ID); sc.State != store.CallFailed || sc.Message != msgStorageFull {
			t.Errorf("the failed call is stored %s %q, want failed %q", sc.State, sc.Message, msgStorageFull)
		}
	})
}

func TestFailedCreatedWriteFailsSubmitAndDropsCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("nospace", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		disk := errors.New("no space left on device")
		h.st.setFail(func(store.Call) error { return disk })
		_, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`))
		if !errors.Is(err, disk) {
			t.Fatalf("Submit error = %v, want the store's", err)
		}
		h.noCall(i)
		if ps := h.project("nospace"); ps.Queued != 0 || ps.Running != 0 {
			t.Errorf("queued %d running %d after a failed submit", ps.Queued, ps.Running)
		}
	})
}

func TestEvictsLeastRecentlyUsedIdleReplicaOfAnotherProject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", minMax(0, 2), idleTimeout(600))
		b := testProject("b", minMax(0, 1))
		h := newHarness(t, Config{}, cpuSlots(2), a, b)
		defer h.stop()
		h.submit(a, `{}`)
		h.submit(a, `{}`)
		as := h.launchedN(2)
		h.ready(as...)
		fa := []*fakeCall{h.call(as[0]), h.call(as[1])}
		h.clk.Advance(time.Second)
		fa[1].reply(`{}`) // as[1] idle first: least recently used
		h.settle()
		h.clk.Advance(time.Second)
		fa[0].reply(`{}`)
		h.settle()

		h.submit(b, `{}`)
		if !as[1].wasStopped() || as[0].wasStopped() {
			t.Fatalf("stopped a-1 %v, a-2 %v; want only a-2 (least recently used)", as[0].wasStopped(), as[1].wasStopped())
		}
		if i := h.launchedN(1)[0]; i.spec.ProjectID != "b" {
			t.Errorf("launched %s", i.spec.ReplicaID)
		}
	})
}

func TestEvictionNeverStopsBusyReplicasOrGoesBelowMin(t *testing.T) {
	for _, tc := range []struct {
		name string
		min  int
		busy bool
	}{
		{"busy replica", 0, true},
		{"replica within min", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := testProject("a", minMax(tc.min, 1), idleTimeout(600))
				b := testProject("b", minMax(0, 1))
				h := newHarness(t, Config{}, cpuSlots(1), a, b)
				defer h.stop()
				h.submit(a, `{}`)
				ia := h.launched()
				h.ready(ia)
				fc := h.call(ia)
				if !tc.busy {
					fc.reply(`{}`)
				}
				h.submit(b, `{}`)
				if ia.wasStopped() {
					t.Fatal("replica evicted")
				}
				h.noLaunch()
				if got := h.project("b").Waiting; got != "waiting for CPU slot" {
					t.Errorf("b waiting = %q", got)
				}
			})
		})
	}
}

func TestCPUSlotsLimitReplicasAcrossProjects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("many", minMax(0, 5))
		h := newHarness(t, Config{}, cpuSlots(2), p)
		defer h.stop()
		for range 5 {
			h.submit(p, `{}`)
		}
		is := h.launchedN(2)
		st := h.s.Snapshot()
		if st.CPUSlots != 2 || st.CPUSlotsUsed != 2 || st.Projects[0].Waiting != "waiting for CPU slot" {
			t.Errorf("status = %+v", st)
		}
		// A slot comes back only once a replica has exited.
		h.ready(is...)
		h.call(is[0]).reply(`{}`)
		h.call(is[1])
		h.noLaunch()
	})
}

func TestWaitingProjectsGetFreedSlotsRoundRobin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ps []store.Project
		for _, id := range []string{"a", "b", "c", "x"} {
			ps = append(ps, testProject(id, minMax(0, 1), idleTimeout(600)))
		}
		a, b, c, x := ps[0], ps[1], ps[2], ps[3]
		h := newHarness(t, Config{}, cpuSlots(1), ps...)
		defer h.stop()
		var order []string
		// run serves the one call of the next replica to boot.
		run := func() {
			t.Helper()
			i := h.launchedN(1)[0]
			order = append(order, i.spec.ProjectID)
			h.ready(i)
			h.call(i).reply(`{}`) // idle now: evicted for the next waiting project
		}
		h.submit(x, `{}`)
		i := h.launched()
		order = append(order, "x")
		h.ready(i)
		fx := h.call(i)
		h.submit(a, `{}`)
		h.submit(b, `{}`)
		fx.reply(`{}`)
		run() // a: first after x in turn order
		h.submit(c, `{}`)
		h.submit(a, `{}`) // a waits again, but c has not had a turn since a
		run()             // b
		run()             // c
		run()             // a
		if want := []string{"x", "a", "b", "c", "a"}; !slices.Equal(order, want) {
			t.Errorf("slot order = %v, want %v", order, want)
		}
	})
}

func TestLookupReportsQueuedBootingRunningThenSucceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("l", minMax(0, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		c1 := h.submit(p, `{}`)
		if got := h.state(c1.ID); got != store.CallBooting {
			t.Errorf("while its replica boots: %s", got)
		}
		i := h.launched()
		h.ready(i)
		fc1 := h.call(i)
		if got := h.state(c1.ID); got != store.CallRunning {
			t.Errorf("dispatched: %s", got)
		}
		c2 := h.submit(p, `{}`)
		if got := h.state(c2.ID); got != store.CallQueued {
			t.Errorf("behind a busy replica: %s", got)
		}
		fc1.reply(`{}`)
		if got := h.result(c1.ID).State; got != store.CallSucceeded {
			t.Errorf("finished: %s", got)
		}
		if got := h.state(c2.ID); got != store.CallRunning {
			t.Errorf("second call after the first: %s", got)
		}
		h.call(i).reply(`{}`)
		if got := h.result(c2.ID).State; got != store.CallSucceeded {
			t.Errorf("second call finished: %s", got)
		}
		if _, _, err := h.s.Lookup("call_nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("unknown call: %v, want store.ErrNotFound", err)
		}
	})
}

func TestGPUReplicasGetWholeGPUsAndWaitWhenNoneIsFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("g", minMax(0, 3), func(p *store.Project) { p.Model.GPUs = 1 })
		h := newHarness(t, Config{}, simulatedGPUs(2), p)
		defer h.stop()
		for range 3 {
			h.submit(p, `{}`)
		}
		is := h.launchedN(2)
		got := [][]string{is[0].spec.GPUs, is[1].spec.GPUs}
		if !slices.Equal(got[0], []string{"GPU-0"}) || !slices.Equal(got[1], []string{"GPU-1"}) {
			t.Errorf("GPUs = %v", got)
		}
		ps := h.project("g")
		if ps.Waiting != "waiting for GPU" || !slices.Equal(ps.Replicas[0].GPUs, []string{"GPU-0"}) {
			t.Errorf("status = %+v", ps)
		}
		if h.s.Snapshot().CPUSlotsUsed != 0 {
			t.Error("a GPU replica took a CPU slot")
		}
	})
}

func TestShutdownStopsEveryReplicaAndLeavesRunningCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("s", minMax(1, 3))
		h := newHarness(t, Config{}, nil, p)
		i1 := h.launched()
		h.ready(i1)
		c := h.submit(p, `{}`)
		h.call(i1)
		h.submit(p, `{}`)
		i2 := h.launched() // still booting
		h.stop()
		if !i1.wasStopped() || !i2.wasStopped() {
			t.Error("replicas left running after shutdown")
		}
		if got := h.st.states(c.ID); !slices.Equal(got, []store.CallState{store.CallQueued, store.CallRunning}) {
			t.Errorf("writes of the running call = %v, want it left running", got)
		}
		if h.s.Ready() {
			t.Error("Ready after Run returned")
		}
		if _, err := h.s.Submit(context.Background(), p, nil); err == nil {
			t.Error("Submit succeeded after Run returned")
		}
	})
}

func TestProjectChangedToNeedMoreGPUsThanMachineFailsQueuedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("g", minMax(0, 1), func(p *store.Project) { p.Model.GPUs = 1 })
		h := newHarness(t, Config{}, simulatedGPUs(1), p)
		defer h.stop()
		h.submit(p, `{}`)
		i := h.launched()
		h.ready(i)
		h.call(i)
		queued := h.submit(p, `{}`)
		p.Model.GPUs = 2
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		if got := h.result(queued.ID); got.Message != "error: project needs 2 GPUs, this machine has 1" {
			t.Errorf("queued call = %s %q", got.State, got.Message)
		}
		if got := h.project("g").LastError; got != "project needs 2 GPUs, this machine has 1" {
			t.Errorf("last error = %q", got)
		}
		h.noLaunch()
	})
}

func TestSubmitForProjectMissingFromStoreFailsAsDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{}, nil)
		defer h.stop()
		// The caller read the project just before it was deleted.
		c := h.submit(testProject("ghost"), `{}`)
		if got := h.result(c.ID); got.Message != "error: project deleted" {
			t.Errorf("call = %s %q", got.State, got.Message)
		}
		if n := len(h.s.Snapshot().Projects); n != 0 {
			t.Errorf("%d projects in the status", n)
		}
	})
}
