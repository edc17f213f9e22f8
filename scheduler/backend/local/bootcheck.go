package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"inferd/scheduler/backend"
)

// Boot diagnosis: while a replica boots, each failed health check is turned
// into a finding the operator can act on (backend.BootProblem), and the two
// findings that waiting cannot fix stop the replica early instead of letting
// it wait out bootTimeout: a model that listens on another port than $PORT,
// and one whose health path answers 404, 405 or 501.

const (
	// listenScanEvery bounds how often a booting replica's listening sockets
	// are read from /proc (a walk over every process's stat file).
	listenScanEvery = 250 * time.Millisecond
	// hopelessAfter is how long a finding that waiting will not fix must
	// hold before the replica is stopped for it: a model that opens a side
	// port before its real one, or answers 404 while its routes register,
	// gets this long to come right.
	hopelessAfter = 2 * time.Second
)

// bootWatch turns the health checks of one booting replica into findings.
// Only the readiness poller uses it.
type bootWatch struct {
	port       int    // the port the model was told to listen on
	pgid       int    // its process group
	healthPath string // what the health check GETs
	// listening returns the TCP ports the group listens on; a field so
	// that a test can fake the model's sockets.
	listening func(pgid int) ([]int, error)

	scanned time.Time // last scan of the listening ports
	ports   []int     // its result
	kind    string    // the kind of the current finding that waiting will not fix
	since   time.Time // when that finding was first made
}

// observe takes the outcome of one health check made at now (its status, or
// the error of a check that got no answer) and returns the finding; Fatal
// once a finding that waiting will not fix has held for hopelessAfter.
func (w *bootWatch) observe(now time.Time, status int, err error) backend.BootProblem {
	text, kind := w.finding(now, status, err)
	if kind == "" || kind != w.kind {
		w.kind, w.since = kind, now
	}
	return backend.BootProblem{Text: text, Fatal: kind != "" && now.Sub(w.since) >= hopelessAfter}
}

// finding describes one failed check, and names its kind when waiting will
// not fix it.
func (w *bootWatch) finding(now time.Time, status int, err error) (text, kind string) {
	get := "GET " + w.healthPath
	switch {
	case err == nil && (status == 404 || status == 405 || status == 501):
		// No such route, no GET there, or (501) no GET at all, as Python's
		// http.server answers a handler without do_GET: not a readiness
		// route, whatever the model is doing.
		return fmt.Sprintf("%s answered %d (set healthPath)", get, status), "path"
	case err == nil:
		return fmt.Sprintf("%s answered %d", get, status), ""
	case errors.Is(err, syscall.ECONNREFUSED):
		return w.refused(now)
	case errors.Is(err, context.DeadlineExceeded), os.IsTimeout(err):
		return fmt.Sprintf("%s got no answer within %s", get, readyAttemptTimeout), ""
	default:
		return fmt.Sprintf("%s failed: %v", get, err), ""
	}
}

// refused explains a refused connection from the ports the model's
// processes listen on.
func (w *bootWatch) refused(now time.Time) (text, kind string) {
	if now.Sub(w.scanned) >= listenScanEvery {
		w.scanned = now
		ports, err := w.listening(w.pgid)
		if err != nil {
			ports = nil // unreadable (the group just ended): say no more than we know
		}
		w.ports = ports
	}
	base := fmt.Sprintf("no answer on 127.0.0.1:%d (the model must listen on $PORT)", w.port)
	switch {
	case len(w.ports) == 0:
		return base + "; it listens on no TCP port yet", ""
	case slices.Contains(w.ports, w.port):
		return base + "; it listens on that port but not on 127.0.0.1 (listen on $HOST)", ""
	}
	list := make([]string, len(w.ports))
	for i, p := range w.ports {
		list[i] = strconv.Itoa(p)
	}
	return base + "; it listens on " + strings.Join(list, ", "), "port"
}

// groupListeningPorts returns the TCP ports that the processes of group
// pgid listen on, sorted. It reads the sockets each member holds
// (/proc/PID/fd) and the listening sockets of a member's network namespace
// (/proc/PID/net/tcp and tcp6), which is the replica's own when it has one.
// Processes it may not read (another user's, when inferd is not root) are
// skipped.
func groupListeningPorts(pgid int) ([]int, error) {
	groups, err := processGroups()
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	members := groups[pgid]
	inodes := map[string]bool{}
	for _, pid := range members {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(dir + "/" + fd.Name())
			if err != nil {
				continue
			}
			if inode, ok := strings.CutPrefix(link, "socket:["); ok {
				inodes[strings.TrimSuffix(inode, "]")] = true
			}
		}
	}
	if len(inodes) == 0 {
		return nil, nil
	}
	var ports []int
	for _, pid := range members {
		found := false
		for _, table := range []string{"tcp", "tcp6"} {
			ps, err := listeningIn("/proc/"+strconv.Itoa(pid)+"/net/"+table, inodes)
			if err == nil {
				found = true
				ports = append(ports, ps...)
			}
		}
		if found {
			break // the members share one network namespace
		}
	}
	slices.Sort(ports)
	return slices.Compact(ports), nil
}

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// listeningIn returns the local ports of the listening sockets in a
// /proc/net/tcp table whose inode is one of inodes.
func listeningIn(path string, inodes map[string]bool) ([]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ports []int
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != tcpListen || !inodes[f[9]] {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if port, err := strconv.ParseUint(hexPort, 16, 16); err == nil {
			ports = append(ports, int(port))
		}
	}
	return ports, sc.Err()
}
