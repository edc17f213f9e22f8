package store

import (
	"fmt"
	"strings"
)

// PayloadUnreachableError is cluster mode's error of a read that needs a
// call payload held on other nodes (store/etcd keeps payloads over its
// inline limit on nodes) when none of them gave it: all are down or cut
// off, or their copies are damaged. Its text is written for the user who
// asked, as the API shows it after "error: "; Unwrap has each holder's
// failure, for the log.
type PayloadUnreachableError struct {
	Kind  string   // "inputs" or "outputs"
	Nodes []string // the nodes that hold it
	Err   error
}

func (e *PayloadUnreachableError) Error() string {
	return fmt.Sprintf("the call's %s are on node(s) %s, which cannot be reached", e.Kind, strings.Join(e.Nodes, ", "))
}

func (e *PayloadUnreachableError) Unwrap() error { return e.Err }
