package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"inferd/httpapi/status"
	"inferd/scheduler"
	"inferd/store"
)

// heldBy is the scheduler's reason of a project the minReplicas of holders
// (acme's echo, other's hidden) leave no CPU slot: a text that names none,
// and one that names them.
func heldBy(holders ...store.ProjectRef) *store.Wait {
	var ids []string
	for _, h := range holders {
		ids = append(ids, h.ID)
	}
	return &store.Wait{Code: scheduler.WaitHeldByMinimums,
		Text:  "no CPU slot: other projects' minReplicas hold all 2 cpuSlots",
		Named: "no CPU slot: the minReplicas of projects " + strings.Join(ids, ", ") + " hold all 2 cpuSlots",
		Names: holders}
}

var (
	holderEcho   = store.ProjectRef{TeamID: "acme", ID: "echo"}
	holderHidden = store.ProjectRef{TeamID: "other", ID: "hidden"}
)

// TestHeldOutReasonNamesOnlyProjectsTheKeyMayReach: acme's zeta is held
// out by other projects' minimums. The status (the project's waiting and
// its queued call's waitingFor) and a check of its call name the holders
// only to a key that may reach every one of them: the admin always, acme's
// team key when they are all acme's, never a key whose allowlist leaves one
// out, and never a team key when one is another team's, whose name then
// appears nowhere in the answer.
func TestHeldOutReasonNamesOnlyProjectsTheKeyMayReach(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holders []store.ProjectRef
		key     string
		named   bool
		secret  string // a name the answer must not contain
	}{
		{"own team's holders, team key", []store.ProjectRef{holderEcho}, keyAcme, true, ""},
		{"own team's holders, allowlist without them", []store.ProjectRef{holderEcho}, keyZetaOnly, false, "echo"},
		{"own team's holders, admin", []store.ProjectRef{holderEcho}, keyAdmin, true, ""},
		{"another team's holder, team key", []store.ProjectRef{holderEcho, holderHidden}, keyAcme, false, "hidden"},
		{"another team's holder, admin", []store.ProjectRef{holderEcho, holderHidden}, keyAdmin, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := heldBy(tc.holders...)
			want := why.Text
			if tc.named {
				want = why.Named
			}
			snap := scheduler.Status{Projects: []scheduler.ProjectStatus{
				{ID: "zeta", TeamID: "acme", Queued: 1, Waiting: scheduler.WaitingCPU, HeldBy: why,
					Queue: []scheduler.QueuedCall{{ID: "call_z", WaitingFor: why}}},
			}}
			env := newEnv(t, Options{Status: &status.Sources{Snapshot: func() scheduler.Status { return snap }}})
			if err := env.store.AddKey(keyZetaOnly, store.APIKey{TeamID: "acme", Scope: store.ScopeTeam,
				KeyLimits: store.KeyLimits{Projects: []string{"zeta"}}}); err != nil {
				t.Fatal(err)
			}
			env.sched.add(store.Call{ID: "call_z", ProjectID: "zeta", TeamID: "acme", State: store.CallQueued, WaitingFor: why})

			rec := serve(env.h, http.MethodGet, "/v1/status", "", "X-Service-API-Key", tc.key)
			if tc.secret != "" && strings.Contains(rec.Body.String(), tc.secret) {
				t.Errorf("the status names %s to this key:\n%s", tc.secret, rec.Body)
			}
			st := decode[status.All](t, rec)
			var zeta *status.Project
			for i := range st.Projects {
				if st.Projects[i].ID == "zeta" {
					zeta = &st.Projects[i]
				}
			}
			if zeta == nil {
				t.Fatalf("zeta not in the status: %+v", st.Projects)
			}
			if zeta.Waiting != want {
				t.Errorf("zeta waiting %q, want %q", zeta.Waiting, want)
			}
			if q := zeta.Queue; len(q) != 1 || q[0].WaitingFor == nil || q[0].WaitingFor.Code != why.Code || q[0].WaitingFor.Text != want {
				t.Errorf("zeta's queue %+v, want call_z waiting for %q", zeta.Queue, want)
			}

			rec = serve(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+tc.key+`", "callID": "call_z"}`)
			if tc.secret != "" && strings.Contains(rec.Body.String(), tc.secret) {
				t.Errorf("the check answer names %s to this key: %s", tc.secret, rec.Body)
			}
			m := inferenceReply(t, rec)
			if w, _ := m["waitingFor"].(map[string]any); w["code"] != why.Code || w["text"] != want {
				t.Errorf("check answer's waitingFor %v, want %q", m["waitingFor"], want)
			}
		})
	}
}
