package pipeline

import (
	"net/http"
	"time"

	"inferd/store"
)

// Placer says where a call of a project runs: Local on one box; in
// cluster mode the cluster's forwarder (httpapi's Routing), which may send
// it to another node.
type Placer interface {
	// Place returns nil to run the call here, or the Remote that runs it
	// elsewhere. r is the door's request (a request another node
	// forwarded runs here). A refusal (no node can take it) is an error.
	Place(r *http.Request, p store.Project) (Remote, error)
}

// Remote runs a request on another node.
type Remote interface {
	// Forward passes the door's request (its body as read) to the node
	// that runs it and that node's answer back to w as it comes, waiting
	// at most limit; it reports false when it wrote nothing (no node was
	// reached, or the one reached failed before answering).
	Forward(w http.ResponseWriter, r *http.Request, body []byte, limit time.Duration) bool
}

// Local runs every call here: the single box.
type Local struct{}

// Place runs p's call here.
func (Local) Place(*http.Request, store.Project) (Remote, error) { return nil, nil }
