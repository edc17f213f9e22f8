package httpapi

import (
	"net/http"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/status"
	"inferd/store"
)

// Route is one endpoint of the public API as New registers it, with the key
// it takes. The table (api.routes) is the one list of endpoints: New serves
// it, and the tests of every keyed route against every key scope, and of
// every endpoint of the daemon, read it, so that a route added here cannot
// escape them.
type Route struct {
	Method, Path string // an httprouter pattern, e.g. /v1/projects/:id
	// Need is the permission a key needs on the route (its handler checks
	// it); "" for a route that takes no API key: the probes, /metrics, the
	// status page's files and /cluster/v1/, whose requests nodes sign.
	Need store.Permission
	// KeyInBody: the key is the JSON body's apiKey (Banana's inference API);
	// Bearer: the Authorization header's Bearer token (the OpenAI API);
	// otherwise the X-Service-API-Key (or X-Banana-API-Key) header.
	KeyInBody bool
	Bearer    bool
}

// Keyed reports whether the route takes an API key.
func (r Route) Keyed() bool { return r.Need != "" }

// route is a Route with its handler.
type route struct {
	Route
	handle httprouter.Handle
}

// Routes lists the endpoints New serves with opts: the optional ones (the
// status API and page, /metrics, /cluster/v1/) as opts enables them.
func Routes(opts Options) []Route {
	a := &api{opts: opts.withDefaults()}
	var out []Route
	for _, r := range a.routes() {
		out = append(out, r.Route)
	}
	return out
}

// routes is the table of the public API.
func (a *api) routes() []route {
	var rs []route
	add := func(method, path string, need store.Permission, inBody bool, h httprouter.Handle) {
		rs = append(rs, route{Route{Method: method, Path: path, Need: need, KeyInBody: inBody}, h})
	}
	// Both spellings of a path are registered: httprouter would otherwise
	// answer the other one with a 307 (a POST's client does not follow it)
	// or, with redirects off, a 404.
	both := func(method, path string, need store.Permission, inBody bool, h httprouter.Handle) {
		add(method, path, need, inBody, h)
		add(method, path+"/", need, inBody, h)
	}
	const open = store.Permission("")

	for _, v := range []string{"v3", "v4"} {
		both(http.MethodPost, "/start/"+v, store.PermInfer, true, a.start)
		both(http.MethodPost, "/check/"+v, store.PermInfer, true, a.check)
	}
	both(http.MethodPost, "/cancel/v4", store.PermInfer, true, a.cancel)
	both(http.MethodDelete, "/v1/projects/:id/queue", store.PermManage, false, a.purgeQueue)
	both(http.MethodPost, "/v1/projects/:id/warmup", store.PermInfer, false, a.warmup)
	both(http.MethodGet, "/v1/projects", store.PermRead, false, a.listProjects)
	both(http.MethodGet, "/v1/projects/:id", store.PermRead, false, a.getProject)
	both(http.MethodPut, "/v1/projects/:id", store.PermManage, false, a.putProject)
	// Banana's Client SDK: base URL http://HOST:PORT/run/PROJECT (run.go).
	add(http.MethodPost, "/run/:project", store.PermInfer, false, a.run)
	add(http.MethodPost, "/run/:project/*route", store.PermInfer, false, a.run)
	add(http.MethodGet, "/v1/calls/:callID/events", store.PermInfer, false, a.callEvents)
	a.openaiRoutes(func(method, path string, need store.Permission, h httprouter.Handle) { // openai.go
		rs = append(rs, route{Route{Method: method, Path: path, Need: need, Bearer: true}, h})
	})
	both(http.MethodGet, "/v1/usage", store.PermRead, false, a.usage)
	add(http.MethodGet, "/healthz", open, false, a.healthz)
	add(http.MethodGet, "/readyz", open, false, a.readyz)
	if m := a.opts.Metrics; m != nil {
		add(http.MethodGet, "/metrics", open, false, m.Serve)
	}
	if a.opts.Routing != nil {
		h := a.clusterAPI()
		for _, method := range clusterMethods {
			add(method, clusterPrefix+"*path", open, false, h)
		}
	}
	if a.opts.Status != nil {
		s := status.New(status.Config{Sources: *a.opts.Status, Store: a.store, Key: a.headerKey, Cluster: a.opts.Cluster, Log: a.log})
		both(http.MethodGet, "/v1/status", store.PermRead, false, s.All)
		both(http.MethodGet, "/v1/status/gpus", store.PermRead, false, s.GPUs)
		both(http.MethodGet, "/v1/status/projects", store.PermRead, false, s.Projects)
		both(http.MethodGet, "/v1/status/calls", store.PermRead, false, s.Calls)
		both(http.MethodGet, "/v1/status/usage", store.PermRead, false, s.Usage)
		add(http.MethodGet, "/v1/status/projects/:id/replicas/:replica/logs", store.PermRead, false, s.Logs)
		if s.Cluster != nil {
			both(http.MethodGet, "/v1/status/cluster", store.PermRead, false, s.Cluster)
		}
		if s.History != nil {
			both(http.MethodGet, "/v1/status/history", store.PermRead, false, s.History)
		}
		add(http.MethodGet, "/", open, false, s.Page)
		add(http.MethodGet, "/assets/:name", open, false, s.Assets)
	}
	return rs
}
