package storetest

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"inferd/store"
)

func ptr(v float64) *float64 { return &v }

// finalWithUsage saves call id of team/project through queued to a final
// state at finished, with usage u, and returns the final record.
func finalWithUsage(t *testing.T, s store.Store, team, project string, state store.CallState, finished time.Time, u store.CallUsage) store.Call {
	t.Helper()
	ctx := context.Background()
	c := store.Call{ID: newCallID(), TeamID: team, ProjectID: project, State: store.CallQueued, Created: finished.Add(-3 * time.Second)}
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	c.State, c.Dispatched = store.CallRunning, finished.Add(-2*time.Second)
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	c.State, c.Finished, c.Usage = state, finished, &u
	c.QueueMs, c.BootMs, c.RunMs = 1000, 500, 2000
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	return c
}

func usageRows(t *testing.T, s store.Store, team string, from, to time.Time) []store.UsageRow {
	t.Helper()
	rows, err := s.UsageRows(team, from, to)
	if err != nil {
		t.Fatalf("UsageRows(%q): %v", team, err)
	}
	if rows == nil {
		t.Fatal("UsageRows returned nil; want an empty slice")
	}
	return rows
}

func approx(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func testCallUsageRollsUpOnceWithTheFinalWrite(t *testing.T, e *env) {
	s := e.open(t)
	hour := time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC)
	u := store.CallUsage{ReplicaSeconds: 2, GPUSeconds: 1, CPUSeconds: ptr(1.5), PeakMemoryBytes: 100, BytesIn: 10, BytesOut: 20,
		PromptTokens: 11, CompletionTokens: 5}
	c := finalWithUsage(t, s, "acme", "p1", store.CallSucceeded, hour.Add(10*time.Minute), u)
	u2 := u
	u2.PeakMemoryBytes, u2.EnergyJoules = 300, ptr(7)
	u2.PromptTokens, u2.CompletionTokens = 0, 0 // a model that reported none (or not an OpenAI one)
	finalWithUsage(t, s, "acme", "p1", store.CallFailed, hour.Add(50*time.Minute), u2)
	finalWithUsage(t, s, "other", "q", store.CallSucceeded, hour.Add(20*time.Minute), u)
	// A final record written again adds nothing.
	if err := s.SaveCall(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	// A final call without usage (finished before inferd kept it) adds nothing.
	bare := store.Call{ID: newCallID(), TeamID: "acme", ProjectID: "p1", State: store.CallSucceeded, Created: hour, Finished: hour.Add(time.Minute)}
	if err := s.SaveCall(context.Background(), bare); err != nil {
		t.Fatal(err)
	}

	check := func(s store.Store) {
		t.Helper()
		rows := usageRows(t, s, "acme", hour, hour.Add(time.Hour))
		if len(rows) != 1 {
			t.Fatalf("acme's rows = %+v; want one (hour, acme, p1)", rows)
		}
		r := rows[0]
		if !r.Hour.Equal(hour) || r.TeamID != "acme" || r.ProjectID != "p1" {
			t.Errorf("row key = %v %s %s; want %v acme p1", r.Hour, r.TeamID, r.ProjectID, hour)
		}
		if r.Calls != 2 || r.Failed != 1 {
			t.Errorf("calls %d failed %d; want 2 and 1 (the re-written final counted once)", r.Calls, r.Failed)
		}
		if !approx(r.ReplicaSeconds, 4) || !approx(r.GPUSeconds, 2) || r.CPUSeconds == nil || !approx(*r.CPUSeconds, 3) {
			t.Errorf("replica %v gpu %v cpu %v; want 4, 2, 3", r.ReplicaSeconds, r.GPUSeconds, r.CPUSeconds)
		}
		if !approx(r.QueueSeconds, 2) || !approx(r.BootWaitSeconds, 1) || !approx(r.RunSeconds, 4) {
			t.Errorf("queue %v bootWait %v run %v; want 2, 1, 4", r.QueueSeconds, r.BootWaitSeconds, r.RunSeconds)
		}
		if r.PeakMemoryBytes != 300 || r.BytesIn != 20 || r.BytesOut != 40 {
			t.Errorf("peak %d in %d out %d; want 300, 20, 40", r.PeakMemoryBytes, r.BytesIn, r.BytesOut)
		}
		if r.PromptTokens != 11 || r.CompletionTokens != 5 {
			t.Errorf("tokens %d prompt, %d completion; want 11 and 5 (one call reported them, its final counted once)", r.PromptTokens, r.CompletionTokens)
		}
		if r.EnergyJoules == nil || !approx(*r.EnergyJoules, 7) {
			t.Errorf("energy %v; want 7 (one call had a reading)", r.EnergyJoules)
		}
		all := usageRows(t, s, "", hour, hour.Add(time.Hour))
		if len(all) != 2 || all[0].TeamID != "acme" || all[1].TeamID != "other" {
			t.Errorf("every team's rows = %+v; want acme's then other's", all)
		}
		if other := all[len(all)-1]; other.EnergyJoules != nil {
			t.Errorf("other's energy = %v; want absent: none of its calls had a reading", *other.EnergyJoules)
		}
		if got := c.Usage; got == nil || got.CPUSeconds == nil {
			t.Fatal("the saved call lost its usage")
		}
		read, err := s.GetCallResult(c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if read.Usage == nil || !approx(read.Usage.ReplicaSeconds, 2) || read.Usage.BytesOut != 20 || read.Usage.PromptTokens != 11 || read.Usage.CompletionTokens != 5 {
			t.Errorf("the call's usage read back = %+v; want what was written", read.Usage)
		}
	}
	check(s)
	check(e.reopen(t, s)) // the ledger survives a restart
}

// testUsageCountsSaturateNeverWrap: a model reports its own token counts;
// however large, the sums saturate (issue 41: two calls reporting
// math.MaxInt64 made a team's tokens read -2), in the call's roll-up and in
// rows added on top of it.
func testUsageCountsSaturateNeverWrap(t *testing.T, e *env) {
	s := e.open(t)
	hour := time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC)
	huge := store.CallUsage{BytesOut: 5, PromptTokens: math.MaxInt64, CompletionTokens: math.MaxInt64 - 1}
	finalWithUsage(t, s, "acme", "p1", store.CallSucceeded, hour.Add(time.Minute), huge)
	finalWithUsage(t, s, "acme", "p1", store.CallSucceeded, hour.Add(2*time.Minute), huge)
	if err := s.AddUsage([]store.UsageRow{{Hour: hour, TeamID: "acme", ProjectID: "p1",
		UsageTotals: store.UsageTotals{PromptTokens: 1000, CompletionTokens: 1000}}}); err != nil {
		t.Fatal(err)
	}
	rows := usageRows(t, s, "acme", hour, hour.Add(time.Hour))
	if len(rows) != 1 {
		t.Fatalf("rows %+v; want one", rows)
	}
	if r := rows[0]; r.PromptTokens != math.MaxInt64 || r.CompletionTokens != math.MaxInt64 || r.Calls != 2 || r.BytesOut != 10 {
		t.Errorf("row = %d prompt, %d completion, %d calls, %d bytes out; want both token counts saturated at %d, 2 calls, 10 bytes",
			r.PromptTokens, r.CompletionTokens, r.Calls, r.BytesOut, int64(math.MaxInt64))
	}
	var sum store.UsageTotals
	for _, r := range rows {
		sum.Add(r.UsageTotals)
	}
	sum.Add(store.UsageTotals{PromptTokens: 7})
	if sum.PromptTokens != math.MaxInt64 {
		t.Errorf("a report's total = %d; want it saturated, never lower than a row", sum.PromptTokens)
	}
}

func testAddUsageSumsByHourTeamAndProject(t *testing.T, e *env) {
	s := e.open(t)
	h1 := time.Date(2025, 1, 2, 1, 0, 0, 0, time.UTC)
	h2 := h1.Add(time.Hour)
	add := func(rows ...store.UsageRow) {
		t.Helper()
		if err := s.AddUsage(rows); err != nil {
			t.Fatal(err)
		}
	}
	add(store.UsageRow{Hour: h1.Add(5 * time.Minute), TeamID: "acme", ProjectID: "p1", UsageTotals: store.UsageTotals{IdleReplicaSeconds: 10, BootReplicaSeconds: 3}},
		store.UsageRow{Hour: h1.Add(55 * time.Minute), TeamID: "acme", ProjectID: "p1", UsageTotals: store.UsageTotals{IdleReplicaSeconds: 5, IdleGPUSeconds: 5}},
		store.UsageRow{Hour: h2, TeamID: "acme", ProjectID: "p1", UsageTotals: store.UsageTotals{IdleReplicaSeconds: 1}})
	add(store.UsageRow{Hour: h1, TeamID: "acme", ProjectID: "p2", UsageTotals: store.UsageTotals{BootReplicaSeconds: 2}})

	err := s.AddUsage([]store.UsageRow{{Hour: h1, TeamID: "acme", ProjectID: "p1", UsageTotals: store.UsageTotals{IdleReplicaSeconds: 100}}, {Hour: h1, TeamID: "acme"}})
	var ve *store.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("a row without a project: %v; want a *ValidationError", err)
	}

	rows := usageRows(t, s, "acme", h1, h2)
	if len(rows) != 2 || rows[0].ProjectID != "p1" || rows[1].ProjectID != "p2" {
		t.Fatalf("hour 1 = %+v; want p1's and p2's rows, in that order", rows)
	}
	if r := rows[0]; !approx(r.IdleReplicaSeconds, 15) || !approx(r.BootReplicaSeconds, 3) || !approx(r.IdleGPUSeconds, 5) || !r.Hour.Equal(h1) {
		t.Errorf("p1's hour 1 = %+v; want idle 15, boot 3, idle GPU 5 on the hour (the refused AddUsage wrote nothing)", r)
	}
	if r := rows[0]; r.CPUSeconds != nil || r.EnergyJoules != nil || r.Calls != 0 {
		t.Errorf("p1's hour 1 has cpu %v energy %v calls %d; want absent, absent, 0", r.CPUSeconds, r.EnergyJoules, r.Calls)
	}
	if got := usageRows(t, s, "acme", h1, h2.Add(time.Hour)); len(got) != 3 {
		t.Errorf("two hours = %d rows; want 3", len(got))
	}
	if got := usageRows(t, s, "acme", h1.Add(time.Minute), h2.Add(time.Hour)); len(got) != 1 || !got[0].Hour.Equal(h2) {
		t.Errorf("from inside hour 1 = %+v; want hour 2's only (a row's hour must be at or after from)", got)
	}
	if got := usageRows(t, s, "other", h1, h2.Add(time.Hour)); len(got) != 0 {
		t.Errorf("another team sees %+v; want nothing", got)
	}
	if got := usageRows(t, s, "acme", h2, h1); len(got) != 0 {
		t.Errorf("an empty range gave %+v", got)
	}
}

func testExpireUsageDropsOnlyOlderHours(t *testing.T, e *env) {
	s := e.open(t)
	old := time.Date(2024, 12, 1, 0, 0, 0, 0, time.UTC) // long over: a store may fold it
	recent := e.clock.Now().Add(-time.Hour)
	if err := s.AddUsage([]store.UsageRow{
		{Hour: old, TeamID: "acme", ProjectID: "p", UsageTotals: store.UsageTotals{IdleReplicaSeconds: 1}},
		{Hour: old.Add(time.Hour), TeamID: "acme", ProjectID: "p", UsageTotals: store.UsageTotals{IdleReplicaSeconds: 2}},
		{Hour: recent, TeamID: "acme", ProjectID: "p", UsageTotals: store.UsageTotals{IdleReplicaSeconds: 4}},
	}); err != nil {
		t.Fatal(err)
	}
	finalWithUsage(t, s, "acme", "p", store.CallSucceeded, old.Add(time.Hour+time.Minute), store.CallUsage{ReplicaSeconds: 8})
	if err := s.AddUsage([]store.UsageRow{{Hour: old.Add(time.Hour), TeamID: "acme", ProjectID: "p", UsageTotals: store.UsageTotals{IdleReplicaSeconds: 16}}}); err != nil {
		t.Fatal(err)
	}
	// An expiry that reaches none of them keeps every sum as it was.
	if _, err := s.ExpireUsage(old.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	n, err := s.ExpireUsage(old.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if n < 1 {
		t.Errorf("ExpireUsage deleted %d; want the oldest hour's", n)
	}
	rows := usageRows(t, s, "", old, recent.Add(time.Hour))
	if len(rows) != 2 {
		t.Fatalf("after expiry: %+v; want the later two hours", rows)
	}
	if r := rows[0]; !r.Hour.Equal(old.Add(time.Hour)) || !approx(r.IdleReplicaSeconds, 18) || !approx(r.ReplicaSeconds, 8) || r.Calls != 1 {
		t.Errorf("second hour = %+v; want idle 18 and one call of 8 replica-seconds", r)
	}
	if r := rows[1]; !approx(r.IdleReplicaSeconds, 4) {
		t.Errorf("recent hour = %+v; want idle 4", r)
	}
}
