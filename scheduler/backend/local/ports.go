package local

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// portTries bounds how often take asks the kernel for a port that no live
// replica holds.
const portTries = 100

// ports hands out the loopback ports replicas listen on. The kernel knows
// only of bound sockets, and a model binds its port a while after it starts
// (seconds for a big one), so it can offer a port that a starting replica
// was just given. A second replica on that port would fail to bind, but its
// health check would reach the first one's server: it would count as ready
// and send its calls to another project's model. So the ports given to
// replicas that have not exited are held here, and never handed out twice.
type ports struct {
	// listen asks the kernel for a free loopback port; a field so that a
	// test can make the kernel repeat a port.
	listen func() (int, error)

	mu   sync.Mutex
	held map[int]bool
}

func newPorts() *ports {
	return &ports{listen: listenPort, held: map[int]bool{}}
}

// take returns a free loopback port that no live replica holds, and holds it
// until release. Another process could still take it before the model binds
// it; the model then fails to boot and the scheduler retries.
func (p *ports) take() (int, error) {
	for range portTries {
		port, err := p.listen()
		if err != nil {
			return 0, err
		}
		p.mu.Lock()
		taken := p.held[port]
		p.held[port] = true
		p.mu.Unlock()
		if !taken {
			return port, nil
		}
	}
	return 0, errors.New("pick port: the kernel offered only ports that other replicas hold")
}

// release gives back a port taken by take.
func (p *ports) release(port int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.held, port)
}

// listenPort asks the kernel for a free loopback port.
func listenPort() (int, error) {
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
