package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

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

// maxHopBody caps a request body the hop reads; the suite's are tiny.
const maxHopBody = 1 << 20

// serveGoHop listens on 127.0.0.1:port and forwards to the model at
// upstream (host:port) until the process is killed.
func serveGoHop(port int, upstream string) error {
	model, err := protocol.New(protocol.Config{Addr: upstream})
	if err != nil {
		return err
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

// startGoHop runs the Go hop in front of the 0 ms model.
func startGoHop(ctx context.Context, e *env) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	upstream := e.direct[len("http://") : len(e.direct)-1]
	p, err := start("go hop", filepath.Join(e.dir, "gohop.log"), nil,
		self, "-go-hop", strconv.Itoa(port), "-go-hop-upstream", upstream)
	if err != nil {
		return err
	}
	e.procs = append(e.procs, p)
	e.goHopPid = p.pid()
	e.goHop = fmt.Sprintf("http://127.0.0.1:%d/", port)
	return waitHTTP(ctx, "GET", e.goHop+"healthz", 10*time.Second)
}

// goHopSpec is a load on the Go hop, its CPU measured as inferd's is.
func (e *env) goHopSpec(name string, c int) runSpec {
	s := e.model(name, e.goHop, c)
	s.pid = e.goHopPid
	return s
}
