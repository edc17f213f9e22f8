// Command noop is the benchmark's model server: it speaks inferd's http
// protocol (GET /healthz, POST / with JSON inputs, JSON reply) and does
// nothing else, so that what a benchmark measures is whatever sits in front
// of it.
//
// Flags (environment variables, since inferd passes only env to a model):
//
//	PORT          port to listen on, on 127.0.0.1 (inferd sets it)
//	NOOP_DELAY    a fixed time each call takes, e.g. 10ms (default 0)
//	NOOP_BOOT     a fixed boot time before the port opens, e.g. 200ms
//	NOOP_BOOTLOG  a file to append one line to once listening: the Unix
//	              time in nanoseconds when main started and when the
//	              listener opened, so the cold-boot benchmark can subtract
//	              the model's own boot time from what inferd adds.
//	NOOP_QUIET    1: print nothing once listening (by default it prints one
//	              line, as most model servers do)
//	NOOP_REPLY_BYTES  reply {"data":"xxx..."} of this many bytes instead,
//	              for the large-payload benchmark
//	NOOP_ITEM_DELAY  a time each input adds (a batch of n: NOOP_DELAY +
//	              n × this), e.g. 1ms: a GPU model's pass, for the
//	              batching benchmark
//	NOOP_SERIAL   1: one call or batch at a time, as a GPU runs one pass
//	              at a time (by default calls overlap)
//
// The reply is {"ok":true}; the inputs are read and ignored. POST /batch
// takes inferd's batch, {"batch": [inputs, ...]}, and answers
// {"outputs": [reply, ...]}, one per input (docs/protocols.md "Batches").
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

var reply = []byte(`{"ok":true}`)

func main() {
	start := time.Now()
	if err := run(start); err != nil {
		fmt.Fprintln(os.Stderr, "noop:", err)
		os.Exit(1)
	}
}

func run(start time.Time) error {
	port := os.Getenv("PORT")
	if _, err := strconv.Atoi(port); err != nil {
		return fmt.Errorf("PORT %q: not a port number", port)
	}
	delay, err := envDuration("NOOP_DELAY")
	if err != nil {
		return err
	}
	boot, err := envDuration("NOOP_BOOT")
	if err != nil {
		return err
	}
	time.Sleep(boot) // stands in for loading a model
	if v := os.Getenv("NOOP_REPLY_BYTES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 12 {
			return fmt.Errorf("NOOP_REPLY_BYTES=%q: want a size of at least 12", v)
		}
		big := append([]byte(`{"data":"`), bytes.Repeat([]byte("x"), n-11)...)
		reply = append(big, `"}`...)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(reply)
	})
	perItem, err := envDuration("NOOP_ITEM_DELAY")
	if err != nil {
		return err
	}
	var device sync.Mutex // held for a pass when NOOP_SERIAL=1
	serial := os.Getenv("NOOP_SERIAL") == "1"
	pass := func(items int) {
		if serial {
			device.Lock()
			defer device.Unlock()
		}
		if d := delay + time.Duration(items)*perItem; d > 0 {
			time.Sleep(d)
		}
	}
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		// Drain the body so the connection can be reused.
		io.Copy(io.Discard, r.Body)
		pass(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(reply)))
		w.Write(reply)
	})
	mux.HandleFunc("POST /batch", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Batch []json.RawMessage }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, `{"error":"want {\"batch\": [...]}"}`, http.StatusBadRequest)
			return
		}
		pass(len(req.Batch))
		out := bytes.NewBufferString(`{"outputs":[`)
		for i := range req.Batch {
			if i > 0 {
				out.WriteByte(',')
			}
			out.Write(reply)
		}
		out.WriteString("]}")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(out.Len()))
		w.Write(out.Bytes())
	})
	ln, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		return err
	}
	if path := os.Getenv("NOOP_BOOTLOG"); path != "" {
		if err := appendLine(path, fmt.Sprintf("%d %d", start.UnixNano(), time.Now().UnixNano())); err != nil {
			return err
		}
	}
	if os.Getenv("NOOP_QUIET") != "1" {
		fmt.Println("noop listening on", ln.Addr())
	}
	return http.Serve(ln, mux)
}

func envDuration(name string) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", name, v, err)
	}
	return d, nil
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, line)
	return errors.Join(err, f.Close())
}
