package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"inferd/httpapi/status"
	"inferd/httpapi/usage"
	"inferd/scheduler"
	"inferd/store"
)

func TestPendingAnswerSaysWhyItWaitsAndWhenItEnds(t *testing.T) {
	env := newEnv(t, Options{})
	eta := int64(2500)
	env.sched.add(store.Call{ID: "call_q", TeamID: "acme", State: store.CallBooting, QueuePosition: 1, ETAMs: &eta,
		WaitingFor: &store.Wait{Code: "booting", Text: "replica booting (12.1 s of a usual 14 s)"}})
	env.sched.add(store.Call{ID: "call_n", TeamID: "acme", State: store.CallQueued,
		WaitingFor: &store.Wait{Code: "capacity", Text: "all 1 CPU slots busy with other projects' calls"}})
	m := inferenceReply(t, serve(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "call_q"}`))
	wait, _ := m["waitingFor"].(map[string]any)
	if m["message"] != "booting" || m["etaMs"] != float64(2500) || wait["code"] != "booting" || wait["text"] != "replica booting (12.1 s of a usual 14 s)" {
		t.Errorf("booting answer: message %v etaMs %v waitingFor %v", m["message"], m["etaMs"], m["waitingFor"])
	}
	m = inferenceReply(t, serve(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "call_n"}`))
	if _, ok := m["etaMs"]; ok || m["message"] != "queued" || m["waitingFor"] == nil {
		t.Errorf("a call without an estimate: etaMs %v message %v waitingFor %v; want no etaMs, queued, a cause", m["etaMs"], m["message"], m["waitingFor"])
	}
}

// usageEnv is newEnv with ledger rows for two teams over two hours; each
// call counts 100 prompt and 10 completion tokens.
func usageEnv(t *testing.T) (*testEnv, time.Time) {
	env := newEnv(t, Options{})
	h := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
	row := func(hour time.Time, team, project string, calls int64, idle float64) store.UsageRow {
		return store.UsageRow{Hour: hour, TeamID: team, ProjectID: project,
			UsageTotals: store.UsageTotals{Calls: calls, ReplicaSeconds: float64(calls), IdleReplicaSeconds: idle,
				PromptTokens: 100 * calls, CompletionTokens: 10 * calls}}
	}
	if err := env.store.AddUsage([]store.UsageRow{
		row(h, "acme", "echo", 2, 10), row(h.Add(time.Hour), "acme", "echo", 3, 20),
		row(h, "acme", "zeta", 1, 0), row(h, "other", "hidden", 7, 30),
	}); err != nil {
		t.Fatal(err)
	}
	return env, h
}

func usageReply(t *testing.T, env *testEnv, query, key string) (int, usage.Report, string) {
	t.Helper()
	rec := serve(env.h, http.MethodGet, "/v1/usage"+query, "", "X-Service-API-Key", key)
	var rep usage.Report
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
			t.Fatalf("usage answer %s: %v", rec.Body, err)
		}
	}
	return rec.Code, rep, rec.Body.String()
}

func TestUsageTeamKeySeesOnlyItsTeam(t *testing.T) {
	env, _ := usageEnv(t)
	code, rep, body := usageReply(t, env, "", keyAcme)
	if code != 200 {
		t.Fatalf("GET /v1/usage = %d %s", code, body)
	}
	if len(rep.Results) != 2 || rep.Results[0].ProjectID != "echo" || rep.Results[1].ProjectID != "zeta" {
		t.Fatalf("acme's usage = %+v; want echo and zeta", rep.Results)
	}
	if rep.Results[0].Calls != 5 || rep.Results[0].IdleReplicaSeconds != 30 || rep.Total.Calls != 6 {
		t.Errorf("echo %+v total %+v; want 5 calls and 30 s idle, 6 calls in all", rep.Results[0].UsageTotals, rep.Total.UsageTotals)
	}
	if !strings.Contains(body, `"promptTokens":500,"completionTokens":50`) || rep.Total.PromptTokens != 600 || rep.Total.CompletionTokens != 60 {
		t.Errorf("tokens: echo %d/%d, total %d/%d; want 500/50 (promptTokens, completionTokens) and 600/60:\n%s",
			rep.Results[0].PromptTokens, rep.Results[0].CompletionTokens, rep.Total.PromptTokens, rep.Total.CompletionTokens, body)
	}
	if strings.Contains(body, "hidden") || strings.Contains(body, `"other"`) {
		t.Errorf("acme's key saw another team's usage: %s", body)
	}
	if code, _, _ := usageReply(t, env, "?team=other", keyAcme); code != http.StatusNotFound {
		t.Errorf("acme asking for team other = %d; want 404", code)
	}
	// The project allowlist narrows it further.
	_, rep, _ = usageReply(t, newScopedUsage(t, env), "", keyZetaOnly)
	if len(rep.Results) != 1 || rep.Results[0].ProjectID != "zeta" {
		t.Errorf("a key limited to zeta saw %+v", rep.Results)
	}
	// An admin key sees every team, and may pick one.
	_, rep, _ = usageReply(t, env, "?groupBy=team", keyAdmin)
	if len(rep.Results) != 2 || rep.Results[1].TeamID != "other" || rep.Results[1].Calls != 7 || rep.Results[0].ProjectID != "" {
		t.Errorf("admin by team = %+v", rep.Results)
	}
	_, rep, _ = usageReply(t, env, "?team=other", keyAdmin)
	if len(rep.Results) != 1 || rep.Results[0].ProjectID != "hidden" {
		t.Errorf("admin, team other = %+v", rep.Results)
	}
}

// newScopedUsage adds the scoped keys of newScopedEnv to env.
func newScopedUsage(t *testing.T, env *testEnv) *testEnv {
	if err := env.store.AddKey(keyZetaOnly, store.APIKey{TeamID: "acme", Scope: store.ScopeTeam, KeyLimits: store.KeyLimits{Projects: []string{"zeta"}}}); err != nil {
		t.Fatal(err)
	}
	if err := env.store.AddKey(keyInferOnly, store.APIKey{TeamID: "acme", Scope: store.ScopeTeam, KeyLimits: store.KeyLimits{Permissions: []store.Permission{store.PermInfer}}}); err != nil {
		t.Fatal(err)
	}
	return env
}

func TestUsageGroupsByHourAndRange(t *testing.T) {
	env, h := usageEnv(t)
	q := "?groupBy=hour&from=" + h.Format(time.RFC3339) + "&to=" + h.Add(2*time.Hour).Format(time.RFC3339)
	_, rep, body := usageReply(t, env, q, keyAcme)
	if len(rep.Results) != 2 || rep.Results[0].Hour == nil || !rep.Results[0].Hour.Equal(h) || rep.Results[0].Calls != 3 || rep.Results[1].Calls != 3 {
		t.Fatalf("by hour = %s; want hour 1 with 3 calls (echo and zeta), hour 2 with 3", body)
	}
	if rep.Results[0].TeamID != "" || rep.Results[0].ProjectID != "" {
		t.Errorf("grouped by hour alone, a line names %q/%q", rep.Results[0].TeamID, rep.Results[0].ProjectID)
	}
	_, rep, _ = usageReply(t, env, "?groupBy=hour,project&from="+h.Add(time.Hour).Format(time.RFC3339), keyAcme)
	if len(rep.Results) != 1 || rep.Results[0].ProjectID != "echo" || rep.Results[0].TeamID != "acme" {
		t.Errorf("from the second hour, by hour and project = %+v", rep.Results)
	}
}

func TestUsageRefusesBadQueries(t *testing.T) {
	env, _ := usageEnv(t)
	env = newScopedUsage(t, env)
	for _, tc := range []struct{ query, key, mention string }{
		{"?groupBy=color", keyAcme, "groupBy"},
		{"?from=yesterday", keyAcme, "RFC 3339"},
		{"?from=2025-02-01&to=2025-01-01", keyAcme, "must be before"},
		{"?from=2020-01-01&to=2025-01-01", keyAcme, "days apart"},
		{"", keyInferOnly, "may not read"},
		{"", "", "missing"},
	} {
		rec := serve(env.h, http.MethodGet, "/v1/usage"+tc.query, "", "X-Service-API-Key", tc.key)
		if rec.Code < 400 || !strings.Contains(rec.Body.String(), tc.mention) {
			t.Errorf("GET /v1/usage%s = %d %s; want an error mentioning %q", tc.query, rec.Code, rec.Body, tc.mention)
		}
	}
}

func TestStatusShowsQueuedCallsEstimatesAndTheUsagePanel(t *testing.T) {
	env, _ := newStatusEnv(t)
	hour := store.UsageHour(statusNow)
	if err := env.store.AddUsage([]store.UsageRow{
		{Hour: hour, TeamID: "acme", ProjectID: "echo", UsageTotals: store.UsageTotals{Calls: 4, ReplicaSeconds: 2, IdleReplicaSeconds: 30}},
		{Hour: hour.Add(-3 * time.Hour), TeamID: "acme", ProjectID: "echo", UsageTotals: store.UsageTotals{BootReplicaSeconds: 12}},
		{Hour: hour.Add(-30 * time.Hour), TeamID: "acme", ProjectID: "echo", UsageTotals: store.UsageTotals{Calls: 100}}, // over a day ago
		{Hour: hour, TeamID: "other", ProjectID: "hidden", UsageTotals: store.UsageTotals{Calls: 9}},
	}); err != nil {
		t.Fatal(err)
	}
	rec := serve(env.h, "GET", "/v1/status/usage", "", "X-Service-API-Key", keyAcme)
	var u status.Usage
	if err := json.Unmarshal(rec.Body.Bytes(), &u); err != nil || rec.Code != 200 {
		t.Fatalf("GET /v1/status/usage = %d %s", rec.Code, rec.Body)
	}
	if len(u.Teams) != 1 || u.Teams[0].TeamID != "acme" || u.Teams[0].Calls != 4 || u.Teams[0].BootReplicaSeconds != 12 {
		t.Errorf("acme's panel teams = %+v; want acme alone, 4 calls in the last 24 h, 12 s booting", u.Teams)
	}
	if len(u.Hours) != 24 || !u.Hours[len(u.Hours)-1].Hour.Equal(hour) || u.Hours[len(u.Hours)-1].Teams["acme"].Idle != 30 ||
		u.Hours[len(u.Hours)-4].Teams["acme"].Boot != 12 {
		t.Errorf("hours = %+v; want 24, the last this hour with 30 s idle, three before it 12 s booting", u.Hours)
	}
	rec = serve(env.h, "GET", "/v1/status/usage", "", "X-Service-API-Key", keyAdmin)
	if !strings.Contains(rec.Body.String(), `"teamId":"other"`) {
		t.Errorf("an admin's panel lacks team other: %s", rec.Body)
	}

	rec = serve(env.h, "GET", "/v1/status/projects", "", "X-Service-API-Key", keyAcme)
	var ps status.Results[status.Project]
	if err := json.Unmarshal(rec.Body.Bytes(), &ps); err != nil {
		t.Fatal(err)
	}
	q := ps.Results[0].Queue
	if len(q) != 1 || q[0].ID != "c4" || q[0].ETAMs == nil || *q[0].ETAMs != 1800 || q[0].WaitingFor.Code != scheduler.WaitReplicasBusy {
		t.Errorf("echo's queue = %+v", q)
	}
}

// Sums of seconds come rounded to thousandths, as inferd usage prints them,
// not with the binary noise of float64 sums (0.9540000000000002).
func TestUsageRoundsSecondsToThousandths(t *testing.T) {
	env := newEnv(t, Options{})
	h := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	cpu := 0.1
	var rows []store.UsageRow
	for _, run := range []float64{0.1, 0.2, 0.654} { // 0.954000…02 summed as float64
		rows = append(rows, store.UsageRow{Hour: h, TeamID: "acme", ProjectID: "echo",
			UsageTotals: store.UsageTotals{Calls: 1, RunSeconds: run, CPUSeconds: &cpu, ReplicaSeconds: run}})
		if err := env.store.AddUsage(rows[len(rows)-1:]); err != nil {
			t.Fatal(err)
		}
	}
	_, rep, body := usageReply(t, env, "", keyAcme)
	if rep.Total.RunSeconds != 0.954 || !strings.Contains(body, `"runSeconds":0.954,`) || !strings.Contains(body, `"cpuSeconds":0.3,`) {
		t.Errorf("usage = %s; want runSeconds 0.954 and cpuSeconds 0.3", body)
	}
}
