package httpapi

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	vm "github.com/VictoriaMetrics/metrics"
	"github.com/rs/zerolog"

	"inferd/batches"
	"inferd/history"
	"inferd/httpapi/metrics"
	"inferd/httpapi/status"
	"inferd/scheduler/backend/local"
	"inferd/store"
)

// The matrix below tries every keyed route of the table (Routes) with every
// kind of key. A route added to the table without a case here fails
// TestEveryKeyedRouteAgainstEveryKeyScope until one is written.

// keyManageOnly holds the manage scope alone (scopes_test.go has the others).
const keyManageOnly = "ik_00000000e5_manageonly"

// routeCase is how the matrix calls one route pattern: its path and body
// with PROJECT, MODELKEY, CALLID, FILEID, BATCHID and KEY standing for the
// target's project, modelKey, a call of it (a finished one when done is
// set: an event stream of a pending call lasts until the call ends), a
// Batch API file and batch of it (batchFixtures) and the key's secret;
// contentType, when set, replaces application/json.
type routeCase struct {
	path, body  string
	done        bool
	contentType string
}

// uploadForm is a multipart upload of a one-line batch file (its model
// names no project: an upload names none).
const uploadForm = "--XB\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" +
	"--XB\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n" +
	`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}` + "\n\r\n--XB--\r\n"

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
	"GET /v1/models/*model":          {path: "/v1/models/PROJECT"},
	"GET /v1/calls/:callID/response": {path: "/v1/calls/CALLID/response", done: true},

	"POST /v1/files":              {path: "/v1/files", body: uploadForm, contentType: "multipart/form-data; boundary=XB"},
	"GET /v1/files":               {path: "/v1/files"},
	"GET /v1/files/:id":           {path: "/v1/files/FILEID"},
	"DELETE /v1/files/:id":        {path: "/v1/files/FILEID"},
	"GET /v1/files/:id/content":   {path: "/v1/files/FILEID/content"},
	"POST /v1/batches":            {path: "/v1/batches", body: `{"input_file_id":"FILEID","endpoint":"/v1/chat/completions","completion_window":"24h"}`},
	"GET /v1/batches":             {path: "/v1/batches"},
	"GET /v1/batches/:id":         {path: "/v1/batches/BATCHID"},
	"POST /v1/batches/:id/cancel": {path: "/v1/batches/BATCHID/cancel"},

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

// matrixOptions enable every optional route of the table
// (TestMatrixOptionsServeEveryRoute holds them to it), with a Batch API in
// batchDir.
func matrixOptions(t *testing.T, batchDir string) Options {
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
	bm, err := batches.New(batches.Config{Dir: batchDir, Log: zerolog.Nop()}) // makes no calls: Run is not called
	if err != nil {
		t.Fatal(err)
	}
	return Options{
		Batches: bm,
		Metrics: metrics.New(vm.NewSet()),
		Cluster: twoNodeCluster(),
		Status: &status.Sources{
			Logs:    local.LogDir(logDir),
			History: fakeHistory{history.Sample{At: time.Unix(1700000000, 0)}},
		},
	}
}

// matrixEnv is newEnv with the keys of every scope and, for each of echo
// and zeta, a pending call (call_<project>), a finished one
// (done_<project>), and fx's file and batch.
func matrixEnv(t *testing.T, fx *batchFixtures) *testEnv {
	batchDir := t.TempDir()
	if err := os.CopyFS(batchDir, os.DirFS(fx.dir)); err != nil {
		t.Fatal(err)
	}
	env := newEnv(t, matrixOptions(t, batchDir))
	env.batchDir = batchDir
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
func callRoute(env *testEnv, fx *batchFixtures, rt Route, rc routeCase, p, secret string) *httptest.ResponseRecorder {
	call := "call_" + p
	if rc.done {
		call = "done_" + p
	}
	r := strings.NewReplacer("PROJECT", p, "MODELKEY", "mk-"+p, "CALLID", call, "FILEID", fx.file[p], "BATCHID", fx.batch[p], "KEY", secret)
	path := r.Replace(rc.path)
	if strings.HasSuffix(rt.Path, "/") {
		path += "/"
	}
	header := []string{"Content-Type", cmp.Or(rc.contentType, "application/json")}
	switch {
	case rt.KeyInBody || secret == "":
	case rt.Bearer:
		header = append(header, "Authorization", "Bearer "+secret)
	default:
		header = append(header, "X-Service-API-Key", secret)
	}
	return serve(env.h, rt.Method, path, r.Replace(rc.body), header...)
}

// batchFixtures is a Batch API directory, made once for the matrix: for
// each of echo and zeta a file of team acme (file) and a batch of another
// (batch), each made by a key limited to that project. Each case works on
// a copy (matrixOptions).
type batchFixtures struct {
	dir         string
	file, batch map[string]string // by project
}

func newBatchFixtures(t *testing.T) *batchFixtures {
	fx := &batchFixtures{dir: t.TempDir(), file: map[string]string{}, batch: map[string]string{}}
	bm, err := batches.New(batches.Config{Dir: fx.dir, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"echo", "zeta"} {
		acc := batches.Access{Team: "acme", Projects: []string{p}}
		line := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"` + p + `","messages":[]}}`
		f, err := bm.PutFile(acc, "in.jsonl", batches.PurposeBatch, strings.NewReader(line))
		if err != nil {
			t.Fatal(err)
		}
		in, err := bm.PutFile(acc, "in.jsonl", batches.PurposeBatch, strings.NewReader(line))
		if err != nil {
			t.Fatal(err)
		}
		b, err := bm.CreateBatch(acc, batches.CreateRequest{InputFileID: in.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"},
			func(model string) (store.Project, bool) { return testProject(p, "acme"), model == p })
		if err != nil {
			t.Fatal(err)
		}
		fx.file[p], fx.batch[p] = f.ID, b.ID
	}
	return fx
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
// warm-ups, the stored projects, and the Batch API's files and batches.
func effects(t *testing.T, env *testEnv) string {
	env.sched.mu.Lock()
	var calls []string
	for id, fc := range env.sched.calls {
		calls = append(calls, id+"="+string(fc.call.State))
	}
	n, warmups := env.sched.n, env.sched.warmups
	env.sched.mu.Unlock()
	slices.Sort(calls)
	echo, zeta := env.store.project("echo"), env.store.project("zeta")
	return fmt.Sprintf("calls %v (%d started), %d warm-ups, echo %d-%d, zeta %d-%d, %s",
		calls, n, warmups, echo.MinReplicas, echo.MaxReplicas, zeta.MinReplicas, zeta.MaxReplicas, batchState(t, env))
}

// batchState lists the Batch API's files and batches, each batch with its
// status, as its directory holds them.
func batchState(t *testing.T, env *testEnv) string {
	var out []string
	for _, sub := range []string{"files", "batches"} {
		paths, err := filepath.Glob(filepath.Join(env.batchDir, sub, "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range paths {
			var rec struct{ ID, Status string }
			b, err := os.ReadFile(path)
			if err == nil {
				err = json.Unmarshal(b, &rec)
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, strings.TrimSuffix(rec.ID+" "+rec.Status, " "))
		}
	}
	slices.Sort(out)
	return fmt.Sprintf("files and batches %v", out)
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
	// hidden: the target is another team's, or outside the key's
	// allowlist; the OpenAI routes answer 404, as for what does not exist.
	hidden bool
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
	{scope: "project-limited/other", secret: keyZetaOnly, target: "echo", holds: none, lists: true, hidden: true},
	{scope: "admin", secret: keyAdmin, target: "echo", holds: every},
	{scope: "team", secret: keyAcme, target: "echo", holds: every},
	{scope: "other team", secret: keyOther, target: "echo", holds: none, lists: true, hidden: true},
	{scope: "revoked", secret: keyRevoked, target: "echo", holds: none},
	{scope: "no key", secret: "", target: "echo", holds: none},
}

// TestEveryKeyedRouteAgainstEveryKeyScope calls every keyed route of the
// table with a key of each scope (read, infer, manage, a key limited to
// another project of its team, admin, a full team key, another team's, a
// revoked one, none): a key that holds the route's scope is served; one that
// lacks it is refused, naming the scope it lacks, and changes nothing; a
// project-limited key is refused on the project outside its list, and a
// listing shows it nothing of that project; another team's file or batch,
// like its model or call, is a 404 on the OpenAI routes.
func TestEveryKeyedRouteAgainstEveryKeyScope(t *testing.T) {
	routes := Routes(matrixOptions(t, t.TempDir()))
	fx := newBatchFixtures(t)
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
		names := slices.ContainsFunc([]string{"PROJECT", "MODELKEY", "CALLID", "FILEID", "BATCHID"}, func(p string) bool {
			return strings.Contains(rc.path, p) || strings.Contains(rc.body, p)
		})
		for _, k := range matrixKeys {
			t.Run(rt.Method+" "+rt.Path+"/"+k.scope, func(t *testing.T) {
				env := matrixEnv(t, fx)
				before := effects(t, env)
				got := answerOf(rt, callRoute(env, fx, rt, rc, k.target, k.secret))
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
				case k.hidden && names && rt.Bearer && got.status != http.StatusNotFound:
					t.Errorf("a %s key was told %d, not 404 as for what does not exist: %s", k.scope, got.status, got)
				}
				if after := effects(t, env); !served && after != before {
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
	env := newEnv(t, Options{Metrics: metrics.New(vm.NewSet()), Status: &status.Sources{}})
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/", "/assets/app.js"} {
		if rec := serve(env.h, http.MethodGet, path, ""); rec.Code != http.StatusOK {
			t.Errorf("GET %s without a key: %d %s", path, rec.Code, rec.Body)
		}
	}
}

// unsetInMatrix are the parts of Options (and its status.Sources) that
// matrixOptions leaves unset and that TestMatrixOptionsServeEveryRoute
// cannot set by itself (interfaces), each with why no route depends on it.
var unsetInMatrix = map[string]string{
	"Sources.Calls": "the calls list reads it; /v1/status/calls is served without it",
}

// TestMatrixOptionsServeEveryRoute holds matrixOptions to every route the
// daemon may serve: with every optional part of Options and its
// status.Sources that they leave unset set too (a pointer to its zero
// value, a func of zero results, a channel), the table has no keyed route
// more. An optional route added later under a new option fails here until
// matrixOptions enables it, so the matrix (and e2e's everyEndpoint) cannot
// miss it.
func TestMatrixOptionsServeEveryRoute(t *testing.T) {
	opts := matrixOptions(t, t.TempDir())
	matrix := Routes(opts)
	full := opts
	if opts.Status != nil {
		status := *opts.Status
		full.Status = &status
	}
	for _, v := range []func() reflect.Value{
		func() reflect.Value { return reflect.ValueOf(&full).Elem() },
		func() reflect.Value { return reflect.ValueOf(full.Status).Elem() }, // once set
	} {
		v := v()
		for i := range v.NumField() {
			f, name := v.Field(i), v.Type().Name()+"."+v.Type().Field(i).Name
			if !f.CanSet() || !isNil(f) {
				continue
			}
			switch f.Kind() {
			case reflect.Pointer:
				f.Set(reflect.New(f.Type().Elem()))
			case reflect.Func:
				f.Set(reflect.MakeFunc(f.Type(), func([]reflect.Value) []reflect.Value {
					var out []reflect.Value
					for o := range f.Type().Outs() {
						out = append(out, reflect.Zero(o))
					}
					return out
				}))
			case reflect.Chan:
				f.Set(reflect.MakeChan(reflect.ChanOf(reflect.BothDir, f.Type().Elem()), 0).Convert(f.Type()))
			default:
				if _, ok := unsetInMatrix[name]; !ok {
					t.Errorf("matrixOptions leave %s (%s) unset: set it there, or say in unsetInMatrix why no route depends on it", name, f.Kind())
				}
			}
		}
	}
	for _, rt := range Routes(full) {
		if rt.Keyed() && !slices.Contains(matrix, rt) {
			t.Errorf("%s %s is served with every option set, not with matrixOptions: enable it there", rt.Method, rt.Path)
		}
	}
}

func isNil(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Chan, reflect.Interface, reflect.Map, reflect.Slice:
		return v.IsNil()
	}
	return false
}
