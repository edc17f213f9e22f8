package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"inferd/history"
	"inferd/scheduler/backend/local"
	"inferd/store"
)

// The matrix below tries every keyed route of the table (Routes) with every
// kind of key. A route added to the table without a case here fails
// TestEveryKeyedRouteAgainstEveryKeyScope until one is written.

// keyManageOnly holds the manage scope alone (scopes_test.go has the others).
const keyManageOnly = "ik_00000000e5_manageonly"

// routeCase is how the matrix calls one route pattern: its path and body
// with PROJECT, MODELKEY, CALLID and KEY standing for the target's project,
// modelKey, a call of it (a finished one when done is set: an event stream
// of a pending call lasts until the call ends) and the key's secret.
type routeCase struct {
	path, body string
	done       bool
}

// routeCases are keyed by "METHOD pattern", the pattern without a trailing
// slash: a pattern's slashed spelling is called the same way, with the slash.
var routeCases = map[string]routeCase{
	"POST /start/v3":  {path: "/start/v3", body: `{"apiKey":"KEY","modelKey":"MODELKEY","modelInputs":{}}`},
	"POST /start/v4":  {path: "/start/v4", body: `{"apiKey":"KEY","modelKey":"MODELKEY","modelInputs":{},"startOnly":true}`},
	"POST /check/v3":  {path: "/check/v3", body: `{"apiKey":"KEY","callID":"CALLID"}`},
	"POST /check/v4":  {path: "/check/v4", body: `{"apiKey":"KEY","callID":"CALLID"}`},
	"POST /cancel/v4": {path: "/cancel/v4", body: `{"apiKey":"KEY","callID":"CALLID"}`},

	"DELETE /v1/projects/:id/queue": {path: "/v1/projects/PROJECT/queue"},
	"POST /v1/projects/:id/warmup":  {path: "/v1/projects/PROJECT/warmup"},
	"GET /v1/projects":              {path: "/v1/projects"},
	"GET /v1/projects/:id":          {path: "/v1/projects/PROJECT"},
	"PUT /v1/projects/:id":          {path: "/v1/projects/PROJECT", body: `{"maxReplicas": 2}`},

	"POST /run/:project":           {path: "/run/PROJECT", body: `{}`},
	"POST /run/:project/*route":    {path: "/run/PROJECT/predict", body: `{}`},
	"GET /v1/calls/:callID/events": {path: "/v1/calls/CALLID/events", done: true},

	"POST /v1/chat/completions":      {path: "/v1/chat/completions", body: `{"model":"PROJECT","messages":[]}`},
	"POST /v1/completions":           {path: "/v1/completions", body: `{"model":"PROJECT","prompt":"x"}`},
	"POST /v1/embeddings":            {path: "/v1/embeddings", body: `{"model":"PROJECT","input":"x"}`},
	"GET /v1/models":                 {path: "/v1/models"},
	"GET /v1/calls/:callID/response": {path: "/v1/calls/CALLID/response", done: true},

	"GET /v1/status":                                     {path: "/v1/status"},
	"GET /v1/status/gpus":                                {path: "/v1/status/gpus"},
	"GET /v1/status/projects":                            {path: "/v1/status/projects"},
	"GET /v1/status/calls":                               {path: "/v1/status/calls"},
	"GET /v1/status/cluster":                             {path: "/v1/status/cluster"},
	"GET /v1/status/history":                             {path: "/v1/status/history"},
	"GET /v1/status/usage":                               {path: "/v1/status/usage"},
	"GET /v1/usage":                                      {path: "/v1/usage"},
	"GET /v1/status/projects/:id/replicas/:replica/logs": {path: "/v1/status/projects/PROJECT/replicas/PROJECT-1/logs"},
}

// openRoutes are the routes that take no key, each for its reason (Route.Need).
var openRoutes = []string{"/healthz", "/readyz", "/metrics", "/", "/assets/:name", clusterPrefix + "*path"}

// matrixOptions enable every optional route of the table.
func matrixOptions(t *testing.T) Options {
	logDir := t.TempDir()
	for _, id := range []string{"echo-1", "zeta-1"} {
		project, _, _ := strings.Cut(id, "-")
		p := local.LogPath(logDir, "acme", project, id)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("listening\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Options{
		Metrics: NewMetrics(vm.NewSet()),
		Cluster: twoNodeCluster(),
		Status: &StatusSources{
			Logs:    local.LogDir(logDir),
			History: fakeHistory{history.Sample{At: time.Unix(1700000000, 0)}},
		},
	}
}

// matrixEnv is newEnv with the keys of every scope and, for each of echo
// and zeta, a pending call (call_<project>) and a finished one
// (done_<project>).
func matrixEnv(t *testing.T) *testEnv {
	env := newEnv(t, matrixOptions(t))
	for secret, lim := range map[string]store.KeyLimits{
		keyReadOnly:   {Permissions: []store.Permission{store.PermRead}},
		keyInferOnly:  {Permissions: []store.Permission{store.PermInfer}},
		keyManageOnly: {Permissions: []store.Permission{store.PermManage}},
		keyZetaOnly:   {Projects: []string{"zeta"}},
	} {
		if err := env.store.AddKey(secret, store.APIKey{TeamID: "acme", Scope: store.ScopeTeam, KeyLimits: lim}); err != nil {
			t.Fatal(err)
		}
	}
	env.sched.instant = true                     // a waiting start or /run is answered at once
	for _, p := range []string{"echo", "zeta"} { // OpenAI models too, for the OpenAI routes
		if _, err := env.store.UpdateProject(p, func(p *store.Project) error { p.Model.Protocol = store.ProtocolOpenAI; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"echo", "zeta"} {
		env.sched.add(store.Call{ID: "call_" + p, ProjectID: p, TeamID: "acme", State: store.CallQueued, Created: time.Now()})
		env.sched.add(store.Call{ID: "done_" + p, ProjectID: p, TeamID: "acme", State: store.CallSucceeded,
			Message: "success", Outputs: json.RawMessage(`{}`), Created: time.Now()})
	}
	return env
}

// callRoute calls rt as rc says, aimed at project p, with key secret ("" for
// none).
func callRoute(env *testEnv, rt Route, rc routeCase, p, secret string) *httptest.ResponseRecorder {
	call := "call_" + p
	if rc.done {
		call = "done_" + p
	}
	r := strings.NewReplacer("PROJECT", p, "MODELKEY", "mk-"+p, "CALLID", call, "KEY", secret)
	path := r.Replace(rc.path)
	if strings.HasSuffix(rt.Path, "/") {
		path += "/"
	}
	if rt.KeyInBody || secret == "" {
		return serve(env.h, rt.Method, path, r.Replace(rc.body))
	}
	if rt.Bearer {
		return serve(env.h, rt.Method, path, r.Replace(rc.body), "Authorization", "Bearer "+secret)
	}
	return serve(env.h, rt.Method, path, r.Replace(rc.body), "X-Service-API-Key", secret)
}

// routeAnswer is what a route said: its status and, for the inference API
// (which answers 200 with an "error:" message), the message.
type routeAnswer struct {
	status  int
	message string
	body    string
}

func (a routeAnswer) String() string { return fmt.Sprintf("%d %s", a.status, a.body) }

func answerOf(rt Route, rec *httptest.ResponseRecorder) routeAnswer {
	a := routeAnswer{status: rec.Code, body: rec.Body.String()}
	if rt.KeyInBody {
		var m struct{ Message string }
		_ = json.Unmarshal(rec.Body.Bytes(), &m)
		a.message = m.Message
	}
	return a
}

// served: the route did its work, not refused the key.
func (a routeAnswer) served(rt Route) bool {
	if rt.KeyInBody {
		return a.status == http.StatusOK && !strings.HasPrefix(a.message, "error:")
	}
	return a.status >= 200 && a.status < 300
}

// refusedScope: the route named the scope the key lacks.
func (a routeAnswer) refusedScope(rt Route) bool {
	if rt.KeyInBody {
		return strings.HasPrefix(a.message, "error: this key may not start or check calls")
	}
	// /run answers 401, not 403: Banana's SDK shows only a 401's body.
	return (a.status == http.StatusForbidden || a.status == http.StatusUnauthorized) && strings.Contains(a.body, "this key may not")
}

// refused: the route turned the key away (any refusal: a project outside a
// key's allowlist may be answered 403 or as if it did not exist).
func (a routeAnswer) refused(rt Route) bool {
	if rt.KeyInBody {
		return a.status == http.StatusOK && strings.HasPrefix(a.message, "error:")
	}
	return a.status == http.StatusForbidden || a.status == http.StatusNotFound || a.status == http.StatusUnauthorized
}

// effects is what a request may have changed: the scheduler's calls and
// warm-ups, and the stored projects.
func effects(env *testEnv) string {
	env.sched.mu.Lock()
	var calls []string
	for id, fc := range env.sched.calls {
		calls = append(calls, id+"="+string(fc.call.State))
	}
	n, warmups := env.sched.n, env.sched.warmups
	env.sched.mu.Unlock()
	slices.Sort(calls)
	echo, zeta := env.store.project("echo"), env.store.project("zeta")
	return fmt.Sprintf("calls %v (%d started), %d warm-ups, echo %d-%d, zeta %d-%d",
		calls, n, warmups, echo.MinReplicas, echo.MaxReplicas, zeta.MinReplicas, zeta.MaxReplicas)
}

// matrixKey is one kind of key: on target project p, whether it should be
// served on a route that needs need.
type matrixKey struct {
	scope  string
	secret string
	target string // the project aimed at
	// holds reports whether the key holds need; for a key that does not,
	// wantScope says the refusal names the missing scope.
	holds     func(need store.Permission) bool
	wantScope bool
	// lists: a route that names no project (a listing) serves the key,
	// showing nothing of the target.
	lists bool
}

func only(p store.Permission) func(store.Permission) bool {
	return func(need store.Permission) bool { return need == p }
}

func every(store.Permission) bool { return true }
func none(store.Permission) bool  { return false }

var matrixKeys = []matrixKey{
	{scope: "read", secret: keyReadOnly, target: "echo", holds: only(store.PermRead), wantScope: true},
	{scope: "infer", secret: keyInferOnly, target: "echo", holds: only(store.PermInfer), wantScope: true},
	{scope: "manage", secret: keyManageOnly, target: "echo", holds: only(store.PermManage), wantScope: true},
	{scope: "project-limited/own", secret: keyZetaOnly, target: "zeta", holds: every},
	{scope: "project-limited/other", secret: keyZetaOnly, target: "echo", holds: none, lists: true},
	{scope: "admin", secret: keyAdmin, target: "echo", holds: every},
	{scope: "team", secret: keyAcme, target: "echo", holds: every},
	{scope: "other team", secret: keyOther, target: "echo", holds: none, lists: true},
	{scope: "revoked", secret: keyRevoked, target: "echo", holds: none},
	{scope: "no key", secret: "", target: "echo", holds: none},
}

// TestEveryKeyedRouteAgainstEveryKeyScope calls every keyed route of the
// table with a key of each scope (read, infer, manage, a key limited to
// another project of its team, admin, a full team key, another team's, a
// revoked one, none): a key that holds the route's scope is served; one that
// lacks it is refused, naming the scope it lacks, and changes nothing; a
// project-limited key is refused on the project outside its list, and a
// listing shows it nothing of that project.
func TestEveryKeyedRouteAgainstEveryKeyScope(t *testing.T) {
	routes := Routes(matrixOptions(t))
	for _, rt := range routes {
		if !rt.Keyed() {
			continue
		}
		pattern := strings.TrimSuffix(rt.Path, "/")
		if rt.Path == "/run/:project/*route" {
			pattern = rt.Path
		}
		rc, ok := routeCases[rt.Method+" "+pattern]
		if !ok {
			t.Errorf("%s %s is a keyed route with no case in routeCases: add how to call it", rt.Method, rt.Path)
			continue
		}
		names := strings.Contains(rc.path, "PROJECT") || strings.Contains(rc.path, "CALLID") ||
			strings.Contains(rc.body, "MODELKEY") || strings.Contains(rc.body, "CALLID") || strings.Contains(rc.body, "PROJECT")
		for _, k := range matrixKeys {
			t.Run(rt.Method+" "+rt.Path+"/"+k.scope, func(t *testing.T) {
				env := matrixEnv(t)
				before := effects(env)
				got := answerOf(rt, callRoute(env, rt, rc, k.target, k.secret))
				served := k.holds(rt.Need) || k.lists && !names
				if k.lists && !names && strings.Contains(got.body, `"`+k.target+`"`) {
					t.Errorf("a %s key was shown project %s: %s", k.scope, k.target, got)
				}
				switch {
				case served && !got.served(rt):
					t.Fatalf("a %s key was refused: %s", k.scope, got)
				case !served && !got.refused(rt):
					t.Fatalf("a %s key was served (this route needs %s): %s", k.scope, rt.Need, got)
				case !served && k.wantScope && !got.refusedScope(rt):
					t.Errorf("the refusal of a %s key does not name the scope it lacks: %s", k.scope, got)
				}
				if after := effects(env); !served && after != before {
					t.Errorf("a refused %s key changed things:\nbefore %s\nafter  %s", k.scope, before, after)
				}
			})
		}
	}
	for _, rt := range routes {
		if !rt.Keyed() && !slices.Contains(openRoutes, rt.Path) {
			t.Errorf("%s %s takes no API key and is not one of the open routes %v: give it the scope it needs (Route.Need)",
				rt.Method, rt.Path, openRoutes)
		}
	}
}

// TestOpenRoutesAnswerWithoutAKey: the routes the table calls open answer
// without a key, so Need "" is never a keyed route's mistake.
func TestOpenRoutesAnswerWithoutAKey(t *testing.T) {
	env := newEnv(t, Options{Metrics: NewMetrics(vm.NewSet()), Status: &StatusSources{}})
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/", "/assets/app.js"} {
		if rec := serve(env.h, http.MethodGet, path, ""); rec.Code != http.StatusOK {
			t.Errorf("GET %s without a key: %d %s", path, rec.Code, rec.Body)
		}
	}
}
