package e2e

import (
	"bytes"
	"context"
	"fmt"
	"mime/multipart"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/history"
	"inferd/httpapi"
	"inferd/httpapi/status"
)

// endpoint is one way a key reaches the public API, aimed at a resource of a
// team (its modelKey, callID or project id). It returns the HTTP status and
// the body with the per-response fields (id, created) blanked, so that two
// answers can be compared byte for byte.
type endpoint struct {
	name  string
	route string // the route it calls, "METHOD pattern" as httpapi.Routes lists it
	call  func(t *testing.T, d *daemon, key string, target isoTarget) (int, string)
}

// isoTarget names one team's resources, or resources that do not exist: a
// Batch API file and batch too.
type isoTarget struct{ modelKey, callID, project, fileID, batchID string }

func inference(path, body string) func(*testing.T, *daemon, string, isoTarget) (int, string) {
	return func(t *testing.T, d *daemon, key string, tg isoTarget) (int, string) {
		b := strings.NewReplacer("KEY", key, "MODELKEY", tg.modelKey, "CALLID", tg.callID).Replace(body)
		status, obj := do(t, "POST", d.base+path, nil, b)
		delete(obj, "id")
		delete(obj, "created")
		return status, fmt.Sprint(obj)
	}
}

func projectAPI(method, path, body string) func(*testing.T, *daemon, string, isoTarget) (int, string) {
	return func(t *testing.T, d *daemon, key string, tg isoTarget) (int, string) {
		status, raw := doRaw(t, method, d.base+strings.NewReplacer("PROJECT", tg.project, "CALLID", tg.callID).Replace(path),
			map[string]string{"X-Service-API-Key": key}, body)
		return status, string(raw)
	}
}

// openaiAPI calls a route of the OpenAI front door with key as its Bearer
// token, PROJECT standing for the project's id as a model name, FILEID
// and BATCHID for its file and batch.
func openaiAPI(method, path, body string) func(*testing.T, *daemon, string, isoTarget) (int, string) {
	return func(t *testing.T, d *daemon, key string, tg isoTarget) (int, string) {
		r := strings.NewReplacer("PROJECT", tg.project, "CALLID", tg.callID, "FILEID", tg.fileID, "BATCHID", tg.batchID)
		status, raw := doRaw(t, method, d.base+r.Replace(path), map[string]string{"Authorization": "Bearer " + key}, r.Replace(body))
		return status, string(raw)
	}
}

// openaiEcho makes examples/echo a project of protocol openai (its health
// and infer paths kept), so that the OpenAI routes name real models.
const openaiEcho = "protocol: openai, healthPath: /healthz, inferPath: /"

// batchOf uploads a one-line batch file of project with key and starts a
// batch of it, for the Batch API's routes: it returns target with the
// file and the batch.
func batchOf(t *testing.T, d *daemon, key string, target isoTarget) isoTarget {
	t.Helper()
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	fmt.Fprintf(fw, `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"messages":[]}}`+"\n", target.project)
	_ = mw.Close()
	auth := map[string]string{"Authorization": "Bearer " + key}
	status, file := do(t, "POST", d.base+"/v1/files", map[string]string{"Authorization": "Bearer " + key, "Content-Type": mw.FormDataContentType()}, form.String())
	if status != http.StatusOK {
		t.Fatalf("upload: %d %v", status, file)
	}
	target.fileID = file["id"].(string)
	status, batch := do(t, "POST", d.base+"/v1/batches", auth,
		`{"input_file_id":"`+target.fileID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`)
	if status != http.StatusOK {
		t.Fatalf("batch: %d %v", status, batch)
	}
	target.batchID = batch["id"].(string)
	return target
}

// everyEndpoint lists every keyed route of the public API that names one
// resource (TestEveryEndpointListsEveryKeyedRoute holds it to the router's
// table); the routes that name none are statusLists, GET /v1/projects and
// GET /v1/models, checked in "list", "status lists" and "openai models",
// and POST /v1/files (an upload is the uploader's: the endpoints that name
// a file show another team's answers as one that does not exist).
var everyEndpoint = []endpoint{
	{"start v4", "POST /start/v4", inference("/start/v4", `{"apiKey":"KEY","modelKey":"MODELKEY","startOnly":true,"modelInputs":{}}`)},
	{"start v4/", "POST /start/v4/", inference("/start/v4/", `{"apiKey":"KEY","modelKey":"MODELKEY","startOnly":true,"modelInputs":{}}`)},
	{"start v3 waiting", "POST /start/v3", inference("/start/v3", `{"apiKey":"KEY","modelKey":"MODELKEY","modelInputs":{}}`)},
	{"check v4", "POST /check/v4", inference("/check/v4", `{"apiKey":"KEY","callID":"CALLID"}`)},
	{"check v4/ longPoll", "POST /check/v4/", inference("/check/v4/", `{"apiKey":"KEY","callID":"CALLID","longPoll":true}`)},
	{"check v3", "POST /check/v3", inference("/check/v3", `{"apiKey":"KEY","callID":"CALLID"}`)},
	{"cancel v4", "POST /cancel/v4", inference("/cancel/v4", `{"apiKey":"KEY","callID":"CALLID"}`)},
	{"get project", "GET /v1/projects/:id", projectAPI("GET", "/v1/projects/PROJECT", "")},
	{"get project/", "GET /v1/projects/:id/", projectAPI("GET", "/v1/projects/PROJECT/", "")},
	{"put project", "PUT /v1/projects/:id", projectAPI("PUT", "/v1/projects/PROJECT", `{"maxReplicas": 7}`)},
	{"put project/", "PUT /v1/projects/:id/", projectAPI("PUT", "/v1/projects/PROJECT/", `{"minReplicas": 1}`)},
	{"delete project queue", "DELETE /v1/projects/:id/queue", projectAPI("DELETE", "/v1/projects/PROJECT/queue", "")},
	{"post project warmup", "POST /v1/projects/:id/warmup", projectAPI("POST", "/v1/projects/PROJECT/warmup", "")},
	{"get replica logs", "GET /v1/status/projects/:id/replicas/:replica/logs", projectAPI("GET", "/v1/status/projects/PROJECT/replicas/PROJECT-1/logs", "")},
	{"get call events", "GET /v1/calls/:callID/events", projectAPI("GET", "/v1/calls/CALLID/events", "")},
	{"post run", "POST /run/:project", projectAPI("POST", "/run/PROJECT", `{}`)},
	{"post run route", "POST /run/:project/*route", projectAPI("POST", "/run/PROJECT/", `{}`)},
	{"post run warmup", "POST /run/:project/*route", projectAPI("POST", "/run/PROJECT/_k/warmup", "")},
	{"openai chat", "POST /v1/chat/completions", openaiAPI("POST", "/v1/chat/completions", `{"model":"PROJECT","messages":[]}`)},
	{"openai completions", "POST /v1/completions", openaiAPI("POST", "/v1/completions", `{"model":"PROJECT","prompt":"x"}`)},
	{"openai embeddings", "POST /v1/embeddings", openaiAPI("POST", "/v1/embeddings", `{"model":"PROJECT","input":"x"}`)},
	{"openai call response", "GET /v1/calls/:callID/response", openaiAPI("GET", "/v1/calls/CALLID/response", "")},
	{"openai model", "GET /v1/models/*model", openaiAPI("GET", "/v1/models/PROJECT", "")},
	{"openai file", "GET /v1/files/:id", openaiAPI("GET", "/v1/files/FILEID", "")},
	{"openai file content", "GET /v1/files/:id/content", openaiAPI("GET", "/v1/files/FILEID/content", "")},
	{"openai file delete", "DELETE /v1/files/:id", openaiAPI("DELETE", "/v1/files/FILEID", "")},
	{"openai batch create", "POST /v1/batches", openaiAPI("POST", "/v1/batches", `{"input_file_id":"FILEID","endpoint":"/v1/chat/completions","completion_window":"24h"}`)},
	{"openai batch", "GET /v1/batches/:id", openaiAPI("GET", "/v1/batches/BATCHID", "")},
	{"openai batch cancel", "POST /v1/batches/:id/cancel", openaiAPI("POST", "/v1/batches/BATCHID/cancel", "")},
}

// statusLists are the status routes that list what the key may see (the
// usage report and panel among them: by project, by team).
var statusLists = []string{"/v1/status", "/v1/status/gpus", "/v1/status/projects", "/v1/status/calls", "/v1/status/history",
	"/v1/status/usage", "/v1/usage"}

// TestEveryEndpointListsEveryKeyedRoute holds everyEndpoint, statusLists
// and the "list" check to the public API's table of routes (the daemon's:
// the status API with its history, no cluster), so that a new keyed route
// cannot be left out of the isolation and revocation tests.
func TestEveryEndpointListsEveryKeyedRoute(t *testing.T) {
	t.Parallel()
	covered := map[string]bool{"GET /v1/projects": true, "GET /v1/models": true, "POST /v1/files": true,
		"GET /v1/files": true, "GET /v1/batches": true} // the lists: see "openai lists"
	for _, ep := range everyEndpoint {
		covered[ep.route] = true
	}
	for _, p := range statusLists {
		covered["GET "+p] = true
	}
	for _, rt := range daemonRoutes {
		if !rt.Keyed() {
			continue
		}
		// A path's slashed spelling is the same handler (httpapi's scope
		// matrix calls both); either stands for the two here.
		r := rt.Method + " " + rt.Path
		if !covered[r] && !covered[strings.TrimSuffix(r, "/")] && !covered[r+"/"] {
			t.Errorf("%s takes a key and is not in everyEndpoint (nor statusLists): add it", r)
		}
	}
	for r := range covered {
		if !slices.ContainsFunc(daemonRoutes, func(rt httpapi.Route) bool { return rt.Method+" "+rt.Path == r }) {
			t.Errorf("everyEndpoint names %s, which the public API does not serve", r)
		}
	}
}

// daemonRoutes are the public API's routes as a single-box daemon serves
// them: the status API with its history, no cluster.
var daemonRoutes = httpapi.Routes(httpapi.Options{Status: &status.Sources{History: noHistory{}}})

// noHistory stands for the daemon's history in the route table: only
// whether there is one matters there.
type noHistory struct{}

func (noHistory) Samples(context.Context) ([]history.Sample, error) { return nil, nil }
func (noHistory) Interval() time.Duration                           { return time.Minute }

// answersWithStatus reports whether an endpoint answers errors with an HTTP
// status (the project API, the status page, events, /run) rather than the
// inference API's 200 and "error:" message (a route whose key is in the
// body).
func answersWithStatus(ep endpoint) bool {
	return !slices.ContainsFunc(daemonRoutes, func(rt httpapi.Route) bool {
		return rt.Method+" "+rt.Path == ep.route && rt.KeyInBody
	})
}

// TestTeamsAreIsolatedOnEveryEndpoint proves that a key of team A can never
// read, start, check or change anything of team B: on every endpoint, B's
// resource answers exactly as one that does not exist (404 on the project
// API, never 403), and B's project, call, file and batch are left
// unchanged. A key of team B limited to another of its projects is held
// off the same way.
func TestTeamsAreIsolatedOnEveryEndpoint(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: 1s\nlongPollWait: 1s\n")
	d := startDaemon(t, dir, cfg)
	keyA, keyB := d.createKey("team-a", false), d.createKey("team-b", false)
	d.apply(fmt.Sprintf(`projects:
  - {id: proj-a, team: team-a, modelKey: mk-a, command: ["python3", "server.py"], dir: %[1]s, env: {E2E_MARKER: %[2]s}, %[3]s}
  - {id: proj-b, team: team-b, modelKey: mk-b, command: ["python3", "server.py"], dir: %[1]s, env: {E2E_MARKER: %[2]s}, %[3]s}
  - {id: proj-b2, team: team-b, modelKey: mk-b2, command: ["python3", "server.py"], dir: %[1]s, env: {E2E_MARKER: %[2]s}, %[3]s}
`, echo, marker(), openaiEcho))
	limitedB := d.createKeyWith("team-b", "--projects", "proj-b2")
	callB := inferenceClient{t: t, base: d.base, key: keyB}.start("mk-b", `{"mine": "b"}`, true)["callID"].(string)
	ofB := batchOf(t, d, keyB, isoTarget{modelKey: "mk-b", callID: callB, project: "proj-b"})
	nowhere := isoTarget{modelKey: "mk-nowhere", callID: "call_0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", project: "proj-nowhere",
		fileID: "file-0190a1b2c3d47e5f8a9b0c1d", batchID: "batch_0190a1b2c3d47e5f8a9b0c1d"}
	_, projectBefore := projectAPI("GET", "/v1/projects/PROJECT", "")(t, d, keyB, ofB)

	for _, who := range []struct{ name, key string }{{"team A", keyA}, {"team B limited to proj-b2", limitedB}} {
		for _, ep := range everyEndpoint {
			t.Run(who.name+"/"+ep.name, func(t *testing.T) {
				gotStatus, got := ep.call(t, d, who.key, ofB)
				wantStatus, want := ep.call(t, d, who.key, nowhere)
				if gotStatus != wantStatus || got != want {
					t.Fatalf("%s reaching proj-b's resource got %d %s;\nfor a resource that does not exist: %d %s",
						who.name, gotStatus, got, wantStatus, want)
				}
				if answersWithStatus(ep) {
					if gotStatus != http.StatusNotFound {
						t.Fatalf("status %d, want 404", gotStatus)
					}
				} else if !strings.Contains(got, "message:error: ") {
					t.Fatalf("answer %s, want an error message", got)
				}
			})
		}
	}
	t.Run("list", func(t *testing.T) {
		status, body := do(t, "GET", d.base+"/v1/projects", map[string]string{"X-Service-API-Key": keyA}, "")
		results := body["results"].([]any)
		if status != 200 || len(results) != 1 || results[0].(map[string]any)["id"] != "proj-a" {
			t.Fatalf("team A lists %d %v, want only proj-a", status, body)
		}
	})
	t.Run("openai models", func(t *testing.T) {
		status, raw := doRaw(t, "GET", d.base+"/v1/models", map[string]string{"Authorization": "Bearer " + keyA}, "")
		if status != http.StatusOK || strings.Contains(string(raw), "proj-b") || !strings.Contains(string(raw), `"proj-a"`) {
			t.Fatalf("team A lists models %d %s, want none of team B's", status, raw)
		}
		status, raw = doRaw(t, "GET", d.base+"/v1/models", map[string]string{"Authorization": "Bearer " + limitedB}, "")
		if status != http.StatusOK || strings.Contains(string(raw), `"proj-b"`) || !strings.Contains(string(raw), `"proj-b2"`) {
			t.Fatalf("a key limited to proj-b2 lists models %d %s, want proj-b2 alone", status, raw)
		}
	})
	t.Run("openai lists", func(t *testing.T) {
		for _, who := range []struct{ name, key string }{{"team A", keyA}, {"team B limited to proj-b2", limitedB}} {
			for _, path := range []string{"/v1/files", "/v1/batches"} {
				status, raw := doRaw(t, "GET", d.base+path, map[string]string{"Authorization": "Bearer " + who.key}, "")
				if status != http.StatusOK || strings.Contains(string(raw), ofB.fileID) || strings.Contains(string(raw), ofB.batchID) {
					t.Fatalf("%s lists %s: %d %s, want none of proj-b's", who.name, path, status, raw)
				}
			}
		}
		status, raw := doRaw(t, "GET", d.base+"/v1/batches", map[string]string{"Authorization": "Bearer " + keyB}, "")
		if status != http.StatusOK || !strings.Contains(string(raw), ofB.batchID) {
			t.Fatalf("team B lists its batches: %d %s", status, raw)
		}
	})
	t.Run("status lists", func(t *testing.T) {
		// The history names no project: its figures are summed over the
		// caller's own (httpapi's TestStatusHistoryShowsTheCallersProjects...).
		for _, path := range statusLists {
			status, raw := doRaw(t, "GET", d.base+path, map[string]string{"X-Service-API-Key": keyA}, "")
			named := path == "/v1/status" || path == "/v1/status/projects"
			if status != http.StatusOK || (named && !strings.Contains(string(raw), `"proj-a"`)) {
				t.Fatalf("GET %s: %d %s, want team A's own project", path, status, raw)
			}
			if strings.Contains(string(raw), "proj-b") || strings.Contains(string(raw), callB) {
				t.Fatalf("GET %s shows team B's project or call to team A: %s", path, raw)
			}
		}
	})
	t.Run("team B's project and call are untouched", func(t *testing.T) {
		if _, after := projectAPI("GET", "/v1/projects/PROJECT", "")(t, d, keyB, ofB); after != projectBefore {
			t.Fatalf("proj-b changed: %s → %s", projectBefore, after)
		}
		if r := (inferenceClient{t: t, base: d.base, key: keyB}).check(callB, false); strings.Contains(r["message"].(string), "error") {
			t.Fatalf("team B's own call: %v", r)
		}
		auth := map[string]string{"Authorization": "Bearer " + keyB}
		if status, f := do(t, "GET", d.base+"/v1/files/"+ofB.fileID, auth, ""); status != http.StatusOK {
			t.Fatalf("team B's file: %d %v", status, f)
		}
		if status, b := do(t, "GET", d.base+"/v1/batches/"+ofB.batchID, auth, ""); status != http.StatusOK || strings.HasPrefix(b["status"].(string), "cancel") {
			t.Fatalf("team B's batch: %d %v", status, b)
		}
	})
	t.Run("the admin API is not on the public listener", func(t *testing.T) {
		for _, path := range []string{"/admin/keys", "/admin/teams", "/admin/backup"} {
			if status, _ := doRaw(t, "GET", d.base+path, map[string]string{"X-Service-API-Key": keyA}, ""); status != http.StatusNotFound {
				t.Fatalf("GET %s on the public listener: %d", path, status)
			}
		}
		fi, err := os.Stat(dir + "/data/inferd.sock")
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("admin socket mode %v, want 0600 (the daemon's user only)", fi.Mode().Perm())
		}
	})
}

// TestRevokedKeyFailsAtOnceOnEveryEndpoint uses a key (so it sits in the
// store's key cache), revokes it with the CLI and, with no pause, proves that
// its very next request fails on every endpoint.
func TestRevokedKeyFailsAtOnceOnEveryEndpoint(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: 1s\nlongPollWait: 1s\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("team-a", false)
	d.apply(fmt.Sprintf("projects:\n  - {id: proj-a, team: team-a, modelKey: mk-a, command: [\"python3\", \"server.py\"], dir: %s, env: {E2E_MARKER: %s}, %s}\n",
		echo, marker(), openaiEcho))
	c := inferenceClient{t: t, base: d.base, key: key}
	own := batchOf(t, d, key, isoTarget{modelKey: "mk-a", callID: c.start("mk-a", `{}`, true)["callID"].(string), project: "proj-a"})
	if status, _ := projectAPI("GET", "/v1/projects/PROJECT", "")(t, d, key, own); status != 200 {
		t.Fatalf("the key works before it is revoked: %d", status)
	}

	id := strings.Split(key, "_")[1] // secrets are ik_<id>_<secret>
	if out, err := d.cli("key", "revoke", id); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, ep := range everyEndpoint {
		t.Run(ep.name, func(t *testing.T) {
			status, got := ep.call(t, d, key, own)
			if answersWithStatus(ep) {
				if status != http.StatusUnauthorized || !strings.Contains(got, `"invalid API key"`) {
					t.Fatalf("revoked key: %d %s", status, got)
				}
			} else if !strings.Contains(got, "message:error: invalid apiKey") {
				t.Fatalf("revoked key: %s", got)
			}
		})
	}
	if status, _ := doRaw(t, "GET", d.base+"/v1/projects", map[string]string{"X-Service-API-Key": key}, ""); status != http.StatusUnauthorized {
		t.Fatalf("list with a revoked key: %d", status)
	}
	for _, route := range []string{"GET /v1/models", "POST /v1/files"} { // the OpenAI routes that name nothing
		method, path, _ := strings.Cut(route, " ")
		if status, raw := doRaw(t, method, d.base+path, map[string]string{"Authorization": "Bearer " + key}, ""); status != http.StatusUnauthorized {
			t.Fatalf("%s with a revoked key: %d %s", route, status, raw)
		}
	}
}
