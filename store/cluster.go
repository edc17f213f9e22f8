package store

import "errors"

// Errors of cluster mode's store (store/etcd); a single box never returns
// them.
var (
	// ErrFenced is a call write refused because the call is no longer this
	// node's: the node's lease lapsed (it was cut off) and the leader may
	// have handed the call to another node. The write is discarded, never
	// retried.
	ErrFenced = errors.New("the call was handed to another node")
	// ErrUnavailable is a request that etcd did not answer in time (lost
	// quorum, or this node cut off from it). The API answers it as
	// "error: cluster unavailable; retry".
	ErrUnavailable = errors.New("cluster unavailable")
)
