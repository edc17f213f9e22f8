//go:build !failpoints

package bolt

// commitFailpoint is a crash point for fault tests; see failpoint.go. In
// production builds it is empty and the compiler drops the calls.
func commitFailpoint(stage string, batch []callWrite) {}

func applyFailpoint(stage string, batch []*logged) {}
