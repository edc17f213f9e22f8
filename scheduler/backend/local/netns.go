package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// A private network namespace per replica (replica.network: private): the
// model sees only a loopback interface of its own, so it cannot reach
// another model, inferd's API or the outside, and every replica may bind
// the same port (a Potassium app's 8000) without a shim.
//
// No helper binary and no ip(8): the thread that forks the model unshares
// its network namespace and brings lo up, and the child inherits it (the
// thread is locked and dies with its goroutine, so no other goroutine ever
// runs in that namespace). inferd reaches the model by creating its socket
// from a thread that has entered the namespace for that one dial (a socket
// stays in the namespace it was created in), then going back.

// modelPort is where a replica in a private namespace listens: the port
// Potassium apps use, and PORT for the others.
const modelPort = 8000

// enterPrivateNetwork moves the calling thread into a new network namespace
// with lo up, and returns a descriptor of that namespace. The caller is
// locked to its thread and must let it die (return without unlocking).
func enterPrivateNetwork() (int, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return -1, fmt.Errorf("new network namespace: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return -1, err
	}
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open network namespace: %w", err)
	}
	return fd, nil
}

// loopbackUp brings up lo in the calling thread's network namespace: a new
// namespace's lo is down, without 127.0.0.1, until then.
func loopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	return nil
}

// canMakeNetns reports whether this process may make network namespaces
// (root, or CAP_SYS_ADMIN and CAP_NET_ADMIN, and no seccomp filter or
// systemd RestrictNamespaces= forbidding it), by making one on a thread that
// is thrown away.
func canMakeNetns() error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies in the new namespace
		fd, err := enterPrivateNetwork()
		if err == nil {
			unix.Close(fd)
		}
		done <- err
	}()
	return <-done
}

// errNetnsClosed is a dial into a replica's namespace after it has ended.
var errNetnsClosed = errors.New("the replica's network namespace is gone")

// netnsDialer dials from inside one replica's network namespace.
type netnsDialer struct {
	dialer net.Dialer

	mu sync.RWMutex // dials hold it to read; close takes it whole
	fd int          // the namespace; -1 once closed
}

func newNetnsDialer(fd int) *netnsDialer {
	return &netnsDialer{dialer: net.Dialer{Timeout: dialTimeout}, fd: fd}
}

// DialContext connects to addr inside the namespace. The socket is made on
// a thread that enters the namespace for this dial only and goes back to
// the daemon's namespace afterwards; a thread that cannot go back dies
// rather than serve any other goroutine from the model's namespace.
func (n *netnsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.fd < 0 {
		return nil, errNetnsClosed
	}
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("dial %s: %w", addr, err)}
			return
		}
		defer unix.Close(home)
		if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("dial %s: enter the replica's network namespace: %w", addr, err)}
			return
		}
		c, err := n.dialer.DialContext(ctx, network, addr)
		if unix.Setns(home, unix.CLONE_NEWNET) != nil {
			// Stay locked: the thread ends with this goroutine.
			ch <- result{c, err}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// set gives the dialer its namespace, once the replica's has been made.
func (n *netnsDialer) set(fd int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.fd = fd
}

// close ends dialing; it waits for dials under way.
func (n *netnsDialer) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fd >= 0 {
		unix.Close(n.fd)
		n.fd = -1
	}
}
