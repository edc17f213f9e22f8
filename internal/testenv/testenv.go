// Package testenv decides what a test does when the machine lacks something it
// needs (a program, a Python module, root). A developer's `go test` skips such a
// test and says what is missing; `make test`, which installs every dependency
// (scripts/test-deps.sh, make client-deps) and sets INFERD_REQUIRE_CLIENT_TESTS=1,
// fails it instead, so a CI run cannot pass by silently skipping what it was
// meant to check.
package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"
)

// RequireVar is the environment variable `make test` sets to 1: under it a
// missing test dependency is a failure, not a skip.
const RequireVar = "INFERD_REQUIRE_CLIENT_TESTS"

// Required reports whether missing test dependencies fail tests (RequireVar=1).
func Required() bool { return os.Getenv(RequireVar) == "1" }

// Missing ends t because something it needs is missing: a skip normally, a
// failure under RequireVar=1. The message says what is missing and, where the
// caller knows, how to get it. It must be called from the test's goroutine.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("missing test dependency: %s (%s=1, as in make test: this test may not skip)", msg, RequireVar)
	}
	t.Skip("missing test dependency: " + msg)
}

// NeedRoot ends t (as Missing does) unless the test runs as root; what says
// what the test does that needs root.
func NeedRoot(t testing.TB, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root: %s (run the tests as root, as CI does)", what)
	}
}

// FreeAddr returns a loopback address (127.0.0.1:port) nobody listens on
// now, for a test server or etcd member to take. The port is drawn below
// the kernel's ephemeral range (ip_local_port_range), where the local port
// of an outgoing connection, or a port-0 listener's, never lands: between
// this check and the server's own bind such a connection of a test running
// beside it had taken the port now and then ("address already in use").
func FreeAddr(t testing.TB) string {
	t.Helper()
	const lowest = 10000
	if top := ephemeralStart() - 1; top > lowest {
		for range 100 {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", lowest+rand.IntN(top-lowest+1)))
			if err != nil {
				continue // taken: draw again
			}
			defer ln.Close()
			return ln.Addr().String()
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// ephemeralStart is the first port of the kernel's ephemeral range (Linux's
// default, 32768, where it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo <= 0 {
		return 32768
	}
	return lo
}
