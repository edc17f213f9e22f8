package admin

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/rs/zerolog"

	"inferd/httpapi/internal/apitest"
	"inferd/httpapi/respond"
	"inferd/store"
)

func FuzzAdminBody(f *testing.F) {
	apply := `{"projects": [{"id": "p1", "teamId": "t1", "minReplicas": 0, "maxReplicas": 1, "inferenceTimeout": 5, "idleTimeout": 1, ` +
		`"model": {"keyHash": "` + store.HashModelKey("mk-p1") + `", "command": ["python3", "server.py"], "protocol": "http", "concurrency": 1, "bootTimeout": 5}}]}`
	for _, s := range []struct {
		route uint8
		body  string
	}{
		{0, `{"team": "acme"}`}, {0, `{"team": "ops", "scope": "admin"}`}, {0, `{"team": "Bad Team"}`},
		{0, `{"team": "acme", "scope": "root"}`}, {0, `{"team": 5}`}, {0, `[]`},
		{1, apply}, {1, `{"projects": [{"id": "x"}]}`}, {1, `{"projects": null}`}, {1, `{"projects": [{}, {}]}`},
		{1, `{"projects": "x"}`}, {1, ``},
		{0, `{"team": "acme", "permissions": ["read"], "expires": "2099-01-01T00:00:00Z", "projects": ["p1"]}`},
		{0, `{"team": "acme", "permissions": ["root"], "expires": "yesterday"}`},
		{1, `{"teams": [{"id": "t1", "quota": {"replicas": 1}}], ` + apply[1:]},
		{1, `{"teams": [{"id": "t1", "quota": {"replicas": -1}}], "projects": []}`},
		{2, `{"quota": {"replicas": 8, "gpus": 2, "queuedBytes": 1024}}`}, {2, `{"quota": {"lots": 1}}`}, {2, `{"quota": null}`},
	} {
		f.Add(s.route, []byte(s.body))
	}
	st := apitest.NewStore(f)
	h := New(st, zerolog.Nop())
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		method, path := http.MethodPost, "/admin/keys"
		switch route % 3 {
		case 1:
			path = "/admin/apply"
		case 2:
			method, path = http.MethodPut, "/admin/teams/t1"
		}
		rec := apitest.Serve(h, method, path, string(body))
		switch rec.Code {
		case http.StatusOK, http.StatusCreated:
			var v map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
				t.Fatalf("answer is not a JSON object: %s", rec.Body)
			}
		case http.StatusBadRequest:
			apitest.ErrorReply(t, rec, rec.Code, respond.CodeBadRequest)
		case http.StatusConflict:
			apitest.ErrorReply(t, rec, rec.Code, respond.CodeConflict)
		case http.StatusRequestEntityTooLarge:
			apitest.ErrorReply(t, rec, rec.Code, respond.CodeTooLarge)
		default:
			t.Fatalf("%s: status %d: %s", path, rec.Code, rec.Body)
		}
		if path == "/admin/apply" && rec.Code == http.StatusOK {
			var req applyRequest
			_ = json.Unmarshal(body, &req)
			for _, p := range req.Projects {
				if err := st.Project(p.ID).Validate(); err != nil {
					t.Fatalf("apply stored an invalid project %s: %v", p.ID, err)
				}
			}
		}
	})
}
