package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"inferd/scheduler/backend"
	"inferd/scheduler/backend/protocol"
)

// The Go hop is a reference point for the hot path's throughput rows: a
// net/http server (the server inferd's router, httprouter, runs on) that
// hands each POST to the no-op model through inferd's own model client
// (scheduler/backend/protocol) and answers with the reply. No store, no
// scheduler, no key, no edge budgets: what inferd's two HTTP hops cost
// alone, in the same language and libraries, so that a ratio against
// direct or nginx says how much of inferd's cost is the hops themselves
// and how much is everything in between. It runs as a process of its own
// (the suite re-executed with -go-hop) so that its CPU is measured as
// inferd's is, from its threads' schedstat.

//
// The durable Go hop is the same plus what a durable service cannot skip:
// after the model's reply, one record per call appended to a log file and
// fdatasynced before the answer, the syncs shared by the calls that queued
// meanwhile (a group commit: one goroutine takes everything waiting, one
// write, one fdatasync). Its log is a plain file that grows with each
// append, as the simplest durable service's would.

// maxHopBody caps a request body the hop reads; the suite's are tiny.
const maxHopBody = 1 << 20

// hopLog is the durable hop's group-committed log.
type hopLog struct {
	f      *os.File
	writes chan hopWrite
}

type hopWrite struct {
	rec  []byte
	done chan error
}

func openHopLog(path string) (*hopLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	l := &hopLog{f: f, writes: make(chan hopWrite, 1024)}
	go l.run() // lives as long as the helper process
	return l, nil
}

// append makes rec durable, sharing the fdatasync with whoever else waits.
func (l *hopLog) append(rec []byte) error {
	w := hopWrite{rec: rec, done: make(chan error, 1)}
	l.writes <- w
	return <-w.done
}

func (l *hopLog) run() {
	var buf []byte
	var group []hopWrite
	for w := range l.writes {
		group = append(group[:0], w)
	more:
		for {
			select {
			case w := <-l.writes:
				group = append(group, w)
			default:
				break more
			}
		}
		buf = buf[:0]
		for _, w := range group {
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(w.rec)))
			buf = append(buf, w.rec...)
		}
		_, err := l.f.Write(buf)
		if err == nil {
			err = unix.Fdatasync(int(l.f.Fd()))
		}
		for _, w := range group {
			w.done <- err
		}
	}
}

// serveGoHop listens on 127.0.0.1:port and forwards to the model at
// upstream (host:port) until the process is killed; with logPath, it is the
// durable hop, logging each call there before it answers.
func serveGoHop(port int, upstream, logPath string) error {
	model, err := protocol.New(protocol.Config{Addr: upstream})
	if err != nil {
		return err
	}
	var log *hopLog
	if logPath != "" {
		if log, err = openHopLog(logPath); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if !model.Healthy(r.Context()) {
			http.Error(w, "model not ready", http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxHopBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out, err := model.Infer(r.Context(), backend.Request{Inputs: body})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if log != nil {
			if err := log.append(out); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.Write(out)
	})
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}

// startGoHops runs the bare and the durable Go hop in front of the 0 ms
// model; the durable one logs beside inferd's data, on the same file system.
func startGoHops(ctx context.Context, e *env) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	upstream := e.direct[len("http://") : len(e.direct)-1]
	for _, h := range []struct {
		name, log string
		url       *string
		pid       *int
	}{
		{"gohop", "", &e.goHop, &e.goHopPid},
		{"durablehop", filepath.Join(e.dir, "durablehop.wal"), &e.durableHop, &e.durableHopPid},
	} {
		port, err := freePort()
		if err != nil {
			return err
		}
		args := []string{self, "-go-hop", strconv.Itoa(port), "-go-hop-upstream", upstream}
		if h.log != "" {
			args = append(args, "-go-hop-log", h.log)
		}
		p, err := start(h.name, filepath.Join(e.dir, h.name+".log"), nil, args...)
		if err != nil {
			return err
		}
		e.procs = append(e.procs, p)
		*h.pid = p.pid()
		*h.url = fmt.Sprintf("http://127.0.0.1:%d/", port)
		if err := waitHTTP(ctx, "GET", *h.url+"healthz", 10*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// goHopSpec is a load on the Go hop, its CPU measured as inferd's is.
func (e *env) goHopSpec(name string, c int) runSpec {
	s := e.model(name, e.goHop, c)
	s.pid = e.goHopPid
	return s
}

// durableHopSpec is a load on the durable Go hop.
func (e *env) durableHopSpec(name string, c int) runSpec {
	s := e.model(name, e.durableHop, c)
	s.pid = e.durableHopPid
	return s
}
