package scheduler

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

// jumpWall steps the clock's wall reading by d, as NTP or an operator setting
// the system clock does, while every pending timer keeps its remaining time:
// Go's timers (time.AfterFunc, which RealClock uses) run on the monotonic
// clock, which never jumps.
func (c *fakeClock) jumpWall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		t.at = t.at.Add(d)
	}
}

// TestWallClockJumpsMoveNoTimeout proves the scheduler holds no deadline as a
// wall-clock instant to compare with Now: a jump of hours either way neither
// fires an inference or boot timeout early nor holds it back.
func TestWallClockJumpsMoveNoTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("jumpy", minMax(1, 1), func(p *store.Project) {
			p.InferenceTimeout = 5
			p.Model.BootTimeout = 30
		})
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i1 := h.launched()
		h.ready(i1)
		c := h.submit(p, `{}`)
		h.call(i1) // never answered

		h.clk.jumpWall(3 * time.Hour)
		h.advance(4 * time.Second)
		if got := h.state(c.ID); got != store.CallRunning {
			t.Fatalf("4 s into a 5 s timeout, after the clock jumped 3 h ahead, the call is %s", got)
		}
		h.clk.jumpWall(-6 * time.Hour)
		h.advance(time.Second)
		if got := h.result(c.ID); got.Message != "error: inference timed out after 5s" {
			t.Fatalf("5 s into a 5 s timeout, after the clock jumped 6 h back: %s %q", got.State, got.Message)
		}

		// The replacement never gets ready: its 30 s boot timeout runs
		// across jumps the same way.
		i2 := h.launched()
		h.clk.jumpWall(24 * time.Hour)
		h.advance(29 * time.Second)
		if i2.wasStopped() {
			t.Fatal("the boot timeout fired early after a jump ahead")
		}
		h.clk.jumpWall(-48 * time.Hour)
		h.advance(time.Second)
		if !i2.wasStopped() {
			t.Fatal("the boot timeout did not fire on time after a jump back")
		}
	})
}

// TestRealClockReadsMonotonicTime guards what the test above assumes of the
// real clock: its readings carry Go's monotonic clock, so that Sub, Since and
// timers between two of them ignore jumps of the wall clock. UTC(), In(),
// Round(0) or a time decoded from the store would strip it.
func TestRealClockReadsMonotonicTime(t *testing.T) {
	if now := RealClock().Now(); !strings.Contains(now.String(), " m=") {
		t.Fatalf("RealClock().Now() = %s has no monotonic reading", now)
	}
}
