package scheduler

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// rows reads the ledger's rows of every team for the day the fake clock
// starts on.
func (h *harness) rows() []store.UsageRow {
	h.t.Helper()
	h.settle()
	day := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	rows, err := h.st.UsageRows("", day, day.Add(24*time.Hour))
	if err != nil {
		h.t.Fatal(err)
	}
	return rows
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestEveryReplicaSecondIsChargedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", team("acme"), minMax(0, 1), concurrency(2), idleTimeout(30))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		a := h.submit(p, `{}`)
		i := h.launched()
		h.advance(5 * time.Second) // boots in 5 s
		h.ready(i)
		ca := h.call(i)
		h.advance(4 * time.Second) // a alone for 4 s
		b := h.submit(p, `{"in": "0123456789"}`)
		cb := h.call(i)
		h.advance(2 * time.Second) // both for 2 s: 1 s each
		ca.reply(`{"out": 1}`)
		h.result(a.ID)
		h.advance(4 * time.Second) // b alone for 4 s
		cb.reply(`{}`)
		h.result(b.ID)
		h.advance(30 * time.Second) // idle until its idleTimeout stops it
		if !i.wasStopped() {
			t.Fatal("the idle replica was not stopped")
		}
		for _, c := range []store.Call{h.result(a.ID), h.result(b.ID)} {
			if c.Usage == nil || !near(c.Usage.ReplicaSeconds, 5) {
				t.Errorf("call %s usage = %+v; want 5 replica-seconds (4 alone, 2 shared)", c.ID, c.Usage)
			}
			if c.Usage != nil && (c.Usage.CPUSeconds != nil || c.Usage.EnergyJoules != nil) {
				t.Errorf("call %s measured cpu %v energy %v; want both absent: the backend measured nothing", c.ID, c.Usage.CPUSeconds, c.Usage.EnergyJoules)
			}
		}
		if u := h.result(b.ID).Usage; u.BytesIn != int64(len(`{"in": "0123456789"}`)) || u.BytesOut != 2 {
			t.Errorf("b's bytes in %d out %d", u.BytesIn, u.BytesOut)
		}
		h.advance(15 * time.Second) // the minute's flush
		rows := h.rows()
		if len(rows) != 1 {
			t.Fatalf("rows = %+v; want one", rows)
		}
		r := rows[0]
		if r.TeamID != "acme" || r.Calls != 2 || !near(r.ReplicaSeconds, 10) || !near(r.BootReplicaSeconds, 5) || !near(r.IdleReplicaSeconds, 30) {
			t.Errorf("row = %+v; want acme, 2 calls, 10 replica-seconds in calls, 5 booting, 30 idle", r)
		}
		if life := r.ReplicaSeconds + r.BootReplicaSeconds + r.IdleReplicaSeconds; !near(life, 45) {
			t.Errorf("charged %v replica-seconds; the replica lived 45", life)
		}
	})
}

func TestReplicaTimeSplitsAtTheHourAndCountsAGPUShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A quarter of a 16 GiB GPU, kept warm by minReplicas.
		p := testProject("a", minMax(1, 1), gpuMemory(4096))
		h := newHarness(t, Config{}, simulatedGPUs(1), p)
		defer h.stop()
		i := h.launched()
		h.advance(10 * time.Second)
		h.ready(i)
		h.advance(time.Hour + 50*time.Second) // to 01:01:00, a flush
		rows := h.rows()
		if len(rows) != 2 {
			t.Fatalf("rows = %+v; want hours 00 and 01", rows)
		}
		h0, h1 := rows[0], rows[1]
		if !near(h0.BootReplicaSeconds, 10) || !near(h0.IdleReplicaSeconds, 3590) || !near(h0.BootGPUSeconds, 2.5) || !near(h0.IdleGPUSeconds, 897.5) {
			t.Errorf("hour 00 = %+v; want boot 10 (2.5 GPU-s), idle 3590 (897.5 GPU-s)", h0)
		}
		if !near(h1.IdleReplicaSeconds, 60) || !h1.Hour.Equal(h0.Hour.Add(time.Hour)) {
			t.Errorf("hour 01 = %+v; want 60 s idle", h1)
		}
	})
}

func TestACallsMeasuresAreItsShareOfItsReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(0, 1), concurrency(2), gpuMemory(8192))
		h := newHarness(t, Config{}, simulatedGPUs(1), p)
		defer h.stop()
		a := h.submit(p, `{}`)
		i := h.launched()
		h.ready(i)
		energy := 40.0
		i.uses.Store(&backend.Usage{CPU: 3 * time.Second, CPUKnown: true, PeakMemoryBytes: 1 << 30, EnergyJoules: &energy})
		ca := h.call(i)
		h.advance(2 * time.Second)
		b := h.submit(p, `{}`)
		cb := h.call(i)
		h.advance(2 * time.Second) // a: 2 s alone, 2 s shared: 3 of its 4 s
		ca.reply(`{}`)
		u := h.result(a.ID).Usage
		if u == nil || !near(u.ReplicaSeconds, 3) || !near(u.GPUSeconds, 1.5) {
			t.Fatalf("usage = %+v; want 3 replica-seconds, 1.5 GPU-seconds (half a GPU)", u)
		}
		// 3/4 of what it measured; energy also halved: half the GPU is its replica's.
		if u.CPUSeconds == nil || !near(*u.CPUSeconds, 2.25) || u.PeakMemoryBytes != 1<<30 || u.EnergyJoules == nil || !near(*u.EnergyJoules, 15) {
			t.Errorf("cpu %v peak %d energy %v; want 2.25, 1 GiB, 15", u.CPUSeconds, u.PeakMemoryBytes, u.EnergyJoules)
		}
		cb.reply(`{}`)
		h.result(b.ID)
	})
}

func TestReplicaUsageWriteRetriesAndEndsAtShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(1, 1))
		h := newHarness(t, Config{UsageFlush: 10 * time.Second}, nil, p)
		h.ready(h.launched())
		h.st.failUsage(errors.New("disk full"))
		h.advance(10 * time.Second) // a flush that fails: its rows come back
		if rows := h.rows(); len(rows) != 0 {
			t.Fatalf("rows after a failed write = %+v", rows)
		}
		h.st.failUsage(nil)
		h.advance(10 * time.Second)
		if rows := h.rows(); len(rows) != 1 || !near(rows[0].IdleReplicaSeconds, 20) {
			t.Fatalf("rows = %+v; want 20 s idle: the failed flush's 10 s and the next 10", rows)
		}
		h.advance(5 * time.Second)
		h.stop() // writes the last 5 s
		st := h.st.Reopen()
		defer st.Close()
		day := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		rows, err := st.UsageRows("", day, day.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || !near(rows[0].IdleReplicaSeconds, 25) {
			t.Errorf("after shutdown: %+v; want 25 s idle", rows)
		}
	})
}

// outageLog records what the scheduler told of its outages.
type outageLog struct {
	mu    sync.Mutex
	lines []string
}

func (o *outageLog) Down(job string, _ error) { o.add("down " + job) }
func (o *outageLog) Up(job string)            { o.add("up " + job) }
func (o *outageLog) add(s string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lines = append(o.lines, s)
}

// Without quorum (cluster mode) the replica usage writes fail at every
// flush: the outage is told once, and once more when a write lands; the
// rows are kept through it.
func TestReplicaUsageWritesTellAnOutageOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(1, 1))
		told := &outageLog{}
		h := newHarness(t, Config{UsageFlush: 10 * time.Second, Outages: told}, nil, p)
		defer h.stop()
		h.ready(h.launched())
		h.st.failUsage(fmt.Errorf("add usage: etcd: %w", store.ErrUnavailable))
		for range 3 {
			h.advance(10 * time.Second)
		}
		h.st.failUsage(nil)
		h.advance(10 * time.Second)
		h.settle()
		told.mu.Lock()
		lines := slices.Clone(told.lines)
		told.mu.Unlock()
		if want := []string{"down write replica usage", "up write replica usage"}; !slices.Equal(lines, want) {
			t.Errorf("outages told: %q; want %q", lines, want)
		}
		if rows := h.rows(); len(rows) != 1 || !near(rows[0].IdleReplicaSeconds, 40) {
			t.Errorf("rows = %+v; want the 40 s idle through the outage", rows)
		}
	})
}
