package replica

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// portTries bounds how often freePort asks the kernel for a port that no live
// replica holds.
const portTries = 100

// held are the loopback ports given to replicas of this daemon that have not
// exited. The kernel knows only of bound sockets, and a model binds its port a
// while after it starts (seconds for a big one), so it can offer a port that a
// starting replica was just given. A second replica on that port would fail to
// bind, but its health check would reach the first one's server: it would count
// as ready and send its calls to another project's model.
var held = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort returns a free loopback port that no live replica of this daemon
// holds, and holds it until releasePort. Another process could still take it
// before the model binds it; the model then fails to boot and the scheduler
// retries.
func freePort() (int, error) {
	for range portTries {
		port, err := listenPort()
		if err != nil {
			return 0, err
		}
		held.Lock()
		taken := held.ports[port]
		held.ports[port] = true
		held.Unlock()
		if !taken {
			return port, nil
		}
	}
	return 0, errors.New("pick port: the kernel offered only ports that other replicas hold")
}

// releasePort gives back a port taken by freePort.
func releasePort(port int) {
	held.Lock()
	defer held.Unlock()
	delete(held.ports, port)
}

// listenPort asks the kernel for a free loopback port; a var so that a test can
// make the kernel repeat a port.
var listenPort = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pick port: %w", err)
	}
	return port, nil
}
