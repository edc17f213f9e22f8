package httpapi

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"inferd/httpapi/admin"
	"inferd/httpapi/metrics"
	"inferd/httpapi/status"
	"inferd/store"
	"inferd/store/bolt"
)

// Every store.Store serves both interfaces; main passes a *bolt.Store.
var (
	_ Store              = store.Store(nil)
	_ admin.Store        = store.Store(nil)
	_ status.RecentCalls = store.Store(nil)
	_ admin.BackupWriter = (*bolt.Store)(nil)
	_ metrics.StoreStats = (*bolt.Store)(nil)
)

// TestProjectAPIOnRealStore runs the admin and project APIs against a real
// bbolt store: keys made through the admin API authenticate on the public
// one, and a rejected PUT leaves the stored project as it was.
func TestProjectAPIOnRealStore(t *testing.T) {
	st, err := bolt.Open(filepath.Join(t.TempDir(), "inferd.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	adm := admin.New(st, zerolog.Nop())
	pub := New(Options{}, st, newFakeScheduler())

	newKey := func(team string) string {
		rec := serve(adm, http.MethodPost, "/admin/keys", `{"team": "`+team+`"}`)
		if rec.Code != http.StatusCreated {
			t.Fatalf("create key: %d %s", rec.Code, rec.Body)
		}
		return decode[struct{ Secret string }](t, rec).Secret
	}
	acme, other := newKey("acme"), newKey("other")

	rec := serve(adm, http.MethodPost, "/admin/apply", applyBody(t, testProject("echo", "acme"), testProject("hidden", "other")))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"created"`) {
		t.Fatalf("apply: %d %s", rec.Code, rec.Body)
	}

	// A modelKey conflict on the second project leaves the first unapplied.
	clash := testProject("clash", "acme")
	clash.Model.KeyHash = store.HashModelKey("mk-echo")
	rec = serve(adm, http.MethodPost, "/admin/apply", applyBody(t, testProject("later", "newteam"), clash))
	apiErrorReply(t, rec, http.StatusConflict, "conflict")
	if _, err := st.GetProject("later"); err == nil {
		t.Error("project later was applied alongside a conflicting one")
	}
	if teams, _ := st.ListTeams(); len(teams) != 2 {
		t.Errorf("teams after a failed apply = %+v, want acme and other only", teams)
	}

	m := inferenceReply(t, serve(pub, http.MethodPost, "/start/v4",
		`{"apiKey": "`+acme+`", "modelKey": "mk-echo", "startOnly": true, "modelInputs": {}}`))
	if m["callID"] != "call_1" {
		t.Errorf("start: %v", m)
	}
	m = inferenceReply(t, serve(pub, http.MethodPost, "/start/v4",
		`{"apiKey": "`+acme+`", "modelKey": "mk-hidden", "startOnly": true, "modelInputs": {}}`))
	if m["message"] != "error: unknown modelKey" {
		t.Errorf("another team's modelKey: %v", m)
	}

	rec = serve(pub, http.MethodPut, "/v1/projects/echo", `{"minReplicas": 5, "maxReplicas": 2}`, "X-Service-API-Key", acme)
	apiErrorReply(t, rec, http.StatusBadRequest, "bad_request")
	if p, _ := st.GetProject("echo"); p.MinReplicas != 0 || p.MaxReplicas != 3 {
		t.Errorf("project changed: %+v", p)
	}

	rec = serve(pub, http.MethodPut, "/v1/projects/echo", `{"maxReplicas": 6}`, "X-Service-API-Key", acme)
	if got := decode[map[string]any](t, rec); rec.Code != http.StatusOK || got["maxReplicas"] != float64(6) || got["idleTimeout"] != float64(30) {
		t.Errorf("put: %d %s", rec.Code, rec.Body)
	}
	apiErrorReply(t, serve(pub, http.MethodGet, "/v1/projects/echo", "", "X-Service-API-Key", other), http.StatusNotFound, "not_found")

	// A revoked key stops working at once.
	keys := decode[struct{ Results []map[string]any }](t, serve(adm, http.MethodGet, "/admin/keys?team=acme", ""))
	serve(adm, http.MethodPost, "/admin/keys/"+keys.Results[0]["id"].(string)+"/revoke", "")
	apiErrorReply(t, serve(pub, http.MethodGet, "/v1/projects", "", "X-Service-API-Key", acme), http.StatusUnauthorized, "unauthorized")
	m = inferenceReply(t, serve(pub, http.MethodPost, "/start/v4", `{"apiKey": "`+acme+`", "modelKey": "mk-echo", "modelInputs": {}}`))
	if m["message"] != "error: invalid apiKey" {
		t.Errorf("message %q", m["message"])
	}
}

// applyBody is the body of POST /admin/apply that declares projects.
func applyBody(t *testing.T, projects ...store.Project) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"projects": projects})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
