package respond

import "strings"

// FailureMessage makes sure a failed call's message says "error".
func FailureMessage(m string) string {
	switch {
	case m == "":
		return "error: inference failed"
	case strings.HasPrefix(m, "error"):
		return m
	default:
		return "error: " + m
	}
}
