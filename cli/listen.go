package cli

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// ListenAPI binds the API's address for serve, and tells doctor whether it
// is free. A failure names the address once, says why in plain words, and
// how to serve elsewhere: the global --listen flag (or listen: in the
// config, $INFERD_LISTEN).
func ListenAPI(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	const elsewhere = "serve on another address with inferd --listen HOST:PORT serve (or listen: in the config, or $INFERD_LISTEN)"
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("cannot listen on %s: another program listens there already; stop it, or %s", addr, elsewhere)
	}
	// net's own error repeats the address ("listen tcp ADDR: bind: ..."):
	// keep only its cause.
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	return nil, fmt.Errorf("cannot listen on %s: %v; %s", addr, err, elsewhere)
}
