// Package status is the status API and page: GET /v1/status and its parts
// (GPUs, projects, calls, usage, replica logs, the charts' history, the
// cluster section) as JSON for a key that may read, each limited to what
// that key may see and never a call's inputs or outputs, and the page at /
// that shows them (package web, embedded). The public API serves its
// handlers from its route table (New returns them); this package holds the
// reading of the sources and the shape of the answers.
package status
