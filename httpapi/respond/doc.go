// Package respond is the answer vocabulary that the HTTP APIs share: the
// JSON error shape and its codes, the mapping of errors to statuses
// (Classify), the writers of JSON bodies, the small decoders of request
// bodies and queries, and the request-id and access-log middleware with
// the router every API is served by. The public API (httpapi), the admin
// API (httpapi/admin) and the status API (httpapi/status) import it; it
// imports none of them, so each writes its answers in the same words.
package respond
