// Package httpapi serves inferd's HTTP interfaces: the Banana-style inference
// API (POST /start/v4, /check/v4, /cancel/v4 and their v3 twins), the Banana
// Client routes (POST /run/PROJECT/ROUTE), the OpenAI routes, the project
// API (/v1/projects, with a project's queue and warm-up), a call's events
// stream, the usage report and health probes: the public doors, each a
// decoder and a renderer over the one call path (package pipeline,
// callpath.go), and the server's wiring (its route table, the edge's
// budgets). The operator's door (inferd call, operator.go) is one of them,
// served by the admin API. In cluster mode (Options.Routing) the call
// path's placer forwards calls and cancels to the node that runs them, and
// the signed API between nodes is served under /cluster/v1/ (forward.go).
//
// Its neighbours have a job each: httpapi/admin is the admin API that the
// daemon serves on its unix socket, httpapi/status the status API and
// page, httpapi/metrics /metrics, httpapi/usage the usage report, and
// httpapi/respond the answer vocabulary they all share (the JSON error
// shape, the mapping of errors to statuses, the router and access log).
//
// The API families answer errors differently, on purpose:
//
//   - Inference endpoints answer HTTP 200 with a JSON object whose "message"
//     carries the outcome ("success", a pending state, or "error: ..."),
//     because the public SDKs turn any other status into an opaque "server
//     error" and lose the message. One exception, in cluster mode: "error:
//     cluster unavailable; retry" is HTTP 503 with the same body, so that a
//     load balancer may try another node (etcd not answering, no node to
//     forward to, or a forward whose node died before answering).
//   - The Banana Client routes (run.go) answer with the statuses that SDK
//     acts on (200 the model's reply, 500 a failed call, 503 to retry, 504
//     still running) and a JSON error body otherwise.
//   - Project and admin endpoints use HTTP status codes with a JSON body
//     {"error": {"code": "...", "message": "..."}}.
//
// Which error becomes which status and message is decided in errors.go for
// the inference endpoints (inferenceMessage, inferenceStatus), in
// respond.Classify for the project, status and admin endpoints, in run.go
// for the Banana Client routes and openai.go for the OpenAI routes. The
// package consumes the store and scheduler through the small interfaces
// declared here (Store, Scheduler and others), so tests run on in-memory
// fakes.
package httpapi
