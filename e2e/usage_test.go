package e2e

import (
	"encoding/csv"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/store"
	"inferd/store/bolt"
)

// usageLine is one line of GET /v1/usage grouped by team.
type usageLine struct {
	TeamID             string   `json:"teamId"`
	Calls              int64    `json:"calls"`
	RunSeconds         float64  `json:"runSeconds"`
	ReplicaSeconds     float64  `json:"replicaSeconds"`
	CPUSeconds         *float64 `json:"cpuSeconds"`
	BytesIn            int64    `json:"bytesIn"`
	BytesOut           int64    `json:"bytesOut"`
	EnergyJoules       *float64 `json:"energyJoules"`
	BootReplicaSeconds float64  `json:"bootReplicaSeconds"`
	IdleReplicaSeconds float64  `json:"idleReplicaSeconds"`
}

// usageByTeam reads GET /v1/usage?groupBy=team with key.
func usageByTeam(t *testing.T, base, key string) map[string]usageLine {
	t.Helper()
	status, body := doRaw(t, "GET", base+"/v1/usage?groupBy=team", map[string]string{"X-Service-API-Key": key}, "")
	var rep struct{ Results []usageLine }
	if err := json.Unmarshal(body, &rep); err != nil || status != 200 {
		t.Fatalf("GET /v1/usage = %d %s", status, body)
	}
	out := map[string]usageLine{}
	for _, l := range rep.Results {
		out[l.TeamID] = l
	}
	return out
}

// within reports whether got is within 5 % of want.
func within(got, want float64) bool { return math.Abs(got-want) <= 0.05*want }

// TestUsageLedgerAddsUpTheCalls runs known calls for two teams (each burns
// a known CPU time; their run times come back in the checks) and checks the
// ledger against them within 5 %, through GET /v1/usage and `inferd
// usage`, before and after a daemon restart: calls, run seconds, the calls'
// replica-seconds, CPU seconds of the replicas' cgroups, bytes; energy
// absent without NVML; the boot and idle time of a replica kept warm by
// minReplicas charged to its own team; a team key sees its team only.
func TestUsageLedgerAddsUpTheCalls(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "cpuSlots: 4\nusage:\n  flushInterval: 1s\n")
	d := startDaemon(t, dir, cfg)
	mark := marker()
	d.apply("projects:\n" +
		echoProject("burner-a", "acme", "mk-burner-a", echo, mark, "") + "    maxReplicas: 1\n" +
		echoProject("burner-l", "labs", "mk-burner-l", echo, mark, `, BOOT_DELAY: "1"`) + "    minReplicas: 1\n    maxReplicas: 1\n")
	admin := d.createKey("ops", true)
	acme := inferenceClient{t: t, base: d.base, key: d.createKey("acme", false)}
	labs := inferenceClient{t: t, base: d.base, key: d.createKey("labs", false)}

	type sums struct {
		calls    int64
		run, cpu float64
		bytesIn  int64
	}
	want := map[string]*sums{"acme": {}, "labs": {}}
	run := func(c inferenceClient, team, modelKey string, burn float64) {
		in := `{"burn": ` + strconv.FormatFloat(burn, 'f', 2, 64) + `}`
		r := c.start(modelKey, in, false)
		if r["message"] != "success" {
			t.Fatalf("call %s: %v", in, r)
		}
		w := want[team]
		w.calls++
		w.cpu += burn
		w.run += r["runMs"].(float64) / 1000
		w.bytesIn += int64(len(in))
	}
	for _, b := range []float64{0.4, 0.3, 0.5, 0.4} {
		run(acme, "acme", "mk-burner-a", b)
	}
	for _, b := range []float64{0.6, 0.2, 0.4} {
		run(labs, "labs", "mk-burner-l", b)
	}

	check := func(when string, got map[string]usageLine) {
		t.Helper()
		for team, w := range want {
			g, ok := got[team]
			if !ok {
				t.Fatalf("%s: no usage for team %s in %v", when, team, got)
			}
			if g.CPUSeconds == nil {
				testenv.Missing(t, "a cgroup v2 per replica, to measure its CPU time (%s: cpuSeconds absent)", when)
			}
			t.Logf("%s: %s ledger: %d calls, run %.3f s, replica %.3f s, CPU %.3f s (burned %.2f); boot %.2f s, idle %.2f s",
				when, team, g.Calls, g.RunSeconds, g.ReplicaSeconds, *g.CPUSeconds, w.cpu, g.BootReplicaSeconds, g.IdleReplicaSeconds)
			if g.Calls != w.calls || !within(g.RunSeconds, w.run) || !within(g.ReplicaSeconds, w.run) ||
				!within(*g.CPUSeconds, w.cpu) || g.BytesIn != w.bytesIn || g.BytesOut == 0 {
				t.Errorf("%s: team %s ledger %+v (cpu %v); want %d calls, %.3f s run and replica time, %.2f s CPU, %d bytes in",
					when, team, g, *g.CPUSeconds, w.calls, w.run, w.cpu, w.bytesIn)
			}
			if g.EnergyJoules != nil {
				t.Errorf("%s: team %s energy = %v; want absent (no NVML energy counter)", when, team, *g.EnergyJoules)
			}
		}
	}
	// labs' replica booted (BOOT_DELAY 1 s) and idles, kept by its
	// minReplicas: its time is labs', none of it acme's.
	eventually(t, 30*time.Second, "labs' idle time in the ledger", func() bool {
		return usageByTeam(t, d.base, admin)["labs"].IdleReplicaSeconds >= 2
	})
	got := usageByTeam(t, d.base, admin)
	check("before the restart", got)
	// A boot takes a second or two here, more on a busy machine: the
	// bound only tells a boot from a replica's whole life.
	bootBound := testenv.Scale(10 * time.Second).Seconds()
	if l := got["labs"]; l.BootReplicaSeconds < 1 || l.BootReplicaSeconds > bootBound {
		t.Errorf("labs' boot time = %.2f s; its model sleeps 1 s before it listens (bound %.0f s) [%s]", l.BootReplicaSeconds, bootBound, testenv.Load())
	}
	if a := got["acme"]; a.BootReplicaSeconds <= 0 || a.BootReplicaSeconds > bootBound {
		t.Errorf("acme's boot time = %.2f s; want its own replica's boot (bound %.0f s) [%s]", a.BootReplicaSeconds, bootBound, testenv.Load())
	}
	if own := usageByTeam(t, d.base, acme.key); len(own) != 1 || own["acme"].Calls != want["acme"].calls {
		t.Errorf("acme's key sees %v; want its own team only", own)
	}

	d.stop()
	d = startDaemon(t, dir, cfg)
	check("after a restart", usageByTeam(t, d.base, admin))

	out, err := d.cli("usage", "--group-by", "team")
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) != 3 {
		t.Fatalf("inferd usage = %q (%v); want a header and two teams", out, err)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	for _, rec := range recs[1:] {
		w := want[rec[col["team"]]]
		calls, _ := strconv.ParseInt(rec[col["calls"]], 10, 64)
		cpu, _ := strconv.ParseFloat(rec[col["cpuSeconds"]], 64)
		runS, _ := strconv.ParseFloat(rec[col["runSeconds"]], 64)
		if w == nil || calls != w.calls || !within(cpu, w.cpu) || !within(runS, w.run) || rec[col["energyJoules"]] != "" {
			t.Errorf("inferd usage row %q; want %+v, energy empty", rec, w)
		}
	}
}

// TestUsageRollUpsAreKeptForTheirRetention: the hourly roll-ups are kept
// for usage.retention and swept after it (docs/operations.md "The usage
// ledger"), not after resultTTL, which is a call's own record's: a data
// file holding the roll-ups of an hour 30 hours ago and of one 72 hours
// ago, under a daemon with retention 48 h, a resultTTL of 1 h and a sweep
// every second, loses the older hour and keeps the other, added to as
// they were.
func TestUsageRollUpsAreKeptForTheirRetention(t *testing.T) {
	t.Parallel()
	dir, cfg := newDaemonDir(t, "resultTTL: 1h\nsweepInterval: 1s\nusage:\n  retention: 48h\n")
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Hour)
	kept, swept := now.Add(-30*time.Hour), now.Add(-72*time.Hour)
	st, err := bolt.Open(filepath.Join(data, "inferd.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Two flushes into each hour: a roll-up is their sum.
	for _, idle := range []float64{1, 2} {
		if err := st.AddUsage([]store.UsageRow{
			{Hour: kept, TeamID: "acme", ProjectID: "p", UsageTotals: store.UsageTotals{IdleReplicaSeconds: idle}},
			{Hour: swept, TeamID: "acme", ProjectID: "p", UsageTotals: store.UsageTotals{IdleReplicaSeconds: 10 * idle}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	d := startDaemon(t, dir, cfg)
	admin := d.createKey("ops", true)
	hours := func() map[string]float64 {
		status, body := doRaw(t, "GET", d.base+"/v1/usage?groupBy=hour&from="+now.Add(-100*time.Hour).Format(time.RFC3339),
			map[string]string{"X-Service-API-Key": admin}, "")
		var rep struct {
			Results []struct {
				Hour string  `json:"hour"`
				Idle float64 `json:"idleReplicaSeconds"`
			}
		}
		if err := json.Unmarshal(body, &rep); err != nil || status != 200 {
			t.Fatalf("GET /v1/usage = %d %s", status, body)
		}
		out := map[string]float64{}
		for _, r := range rep.Results {
			out[r.Hour] = r.Idle
		}
		return out
	}
	key := func(h time.Time) string { return h.Format(time.RFC3339) }
	eventually(t, 30*time.Second, "the sweep to drop the hour past usage.retention", func() bool {
		_, ok := hours()[key(swept)]
		return !ok
	})
	if got := hours(); got[key(kept)] != 3 {
		t.Errorf("usage by hour after the sweep = %v; want the hour %s kept (within usage.retention, past resultTTL) with its two flushes' 3 s idle",
			got, key(kept))
	}
}

// TestUsageOfBatchedCallsSharesTheirPass: calls that run in one batch share
// its pass's replica time, as calls running at once on a replica do
// (docs/operations.md "The usage ledger": every replica second charged
// once): four calls in one pass of a batching project are charged that
// pass once between them in /v1/usage and `inferd usage`, not once each,
// while each call's run time is the whole pass.
func TestUsageOfBatchedCallsSharesTheirPass(t *testing.T) {
	t.Parallel()
	dir, cfg := newDaemonDir(t, "usage:\n  flushInterval: 1s\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	// Each pass takes 400 ms whatever it carries.
	d.apply("projects:\n" + batchProject(t, "batched", "mk-batched", 1, 4, 50) + "    env: {BATCH_FIXED_MS: \"400\", BATCH_ITEM_MS: \"0\"}\n")
	c := inferenceClient{t: t, base: d.base, key: key}
	eventually(t, time.Minute, "batched's replica ready", func() bool {
		return slices.Equal(d.replicaStates(key, "batched"), []string{"ready"})
	})

	// A held pass, alone; four calls queue behind it and go in one pass.
	h := newHold(t)
	held := c.heldBatch("mk-batched", h)
	four := c.startAll("mk-batched", `{"n":1}`, `{"n":2}`, `{"n":3}`, `{"n":4}`)
	h.release(t)
	heldRun := c.waitResult(held)["runMs"].(float64) / 1000
	var batchRun float64
	for _, id := range four {
		r := c.waitResult(id)
		if r["message"] != "success" || output(t, r)["batchSize"] != 4.0 {
			t.Fatalf("call %s: %v; want success in a batch of 4", id, r)
		}
		batchRun += r["runMs"].(float64) / 1000
	}

	type totals struct{ calls, run, replica float64 }
	var got totals
	eventually(t, 30*time.Second, "the five calls in /v1/usage", func() bool {
		status, body := doRaw(t, "GET", d.base+"/v1/usage?groupBy=project", map[string]string{"X-Service-API-Key": key}, "")
		var rep struct {
			Results []struct {
				ProjectID      string  `json:"projectId"`
				Calls          float64 `json:"calls"`
				RunSeconds     float64 `json:"runSeconds"`
				ReplicaSeconds float64 `json:"replicaSeconds"`
			} `json:"results"`
		}
		if err := json.Unmarshal(body, &rep); err != nil || status != 200 {
			t.Fatalf("GET /v1/usage = %d %s", status, body)
		}
		for _, r := range rep.Results {
			if r.ProjectID == "batched" {
				got = totals{r.Calls, r.RunSeconds, r.ReplicaSeconds}
			}
		}
		return got.calls == 5 // the held call and the four
	})
	t.Logf("usage of batched: %+v; the held pass ran %.3f s, the four calls' runs add up to %.3f s", got, heldRun, batchRun)
	// The held call ran alone: its replica time is its run. What is left is
	// the four's: one pass between them, a quarter of their runs' sum.
	if share := got.replica - heldRun; share <= 0 || share > 0.5*batchRun {
		t.Errorf("the four calls of one pass were charged %.3f s of replica time for runs adding up to %.3f s: want the pass once between them (about a quarter), not once each [%s]",
			share, batchRun, testenv.Load())
	}
}
