// Package httpapi serves inferd's HTTP interfaces: the Banana-style inference
// API (POST /start/v4, /check/v4 and their v3 twins), the project API
// (/v1/projects), health probes, and the admin API that the daemon serves on
// its unix socket.
//
// The two API families answer errors differently, on purpose:
//
//   - Inference endpoints always answer HTTP 200 with a JSON object whose
//     "message" carries the outcome ("success", a pending state, or
//     "error: ..."), because the public SDKs turn any other status into an
//     opaque "server error" and lose the message.
//   - Project and admin endpoints use HTTP status codes with a JSON body
//     {"error": {"code": "...", "message": "..."}}.
//
// Which error becomes which status or message is decided in one place,
// errors.go. The package consumes the store and scheduler through the small
// Store, Scheduler and AdminStore interfaces declared here, so tests run on
// in-memory fakes.
package httpapi
