// Command batchbudget measures what the Batch API's budgets hold at the
// scale of issue 41's reproductions, with the default config: the daemon's
// peak RSS while one key creates batches of a 95 MiB one-line file 8 and
// 16 at once, while it creates 100 batches with 9.4 MiB of metadata, and
// its RSS after a restart with many ended batches. It prints a Markdown
// table (docs/benchmarks.md, "The Batch API's budgets").
//
//	go build -o bench/out/inferd . && go build -o bench/out/noop ./bench/noop
//	go run ./bench/batchbudget -inferd bench/out/inferd -noop bench/out/noop
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"inferd/bench/payload"
)

func main() {
	inferd := flag.String("inferd", "bench/out/inferd", "inferd binary")
	noop := flag.String("noop", "bench/out/noop", "no-op model binary (go build ./bench/noop)")
	ended := flag.Int("ended", 400, "ended batches to make before the restart")
	flag.Parse()
	if err := run(*inferd, *noop, *ended); err != nil {
		fmt.Fprintln(os.Stderr, "batchbudget:", err)
		os.Exit(1)
	}
}

// daemon is inferd serving on a data dir of its own.
type daemon struct {
	bin, cfg, base, key string
	cmd                 *exec.Cmd
}

func run(inferd, noop string, ended int) error {
	dir, err := os.MkdirTemp("", "batchbudget")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if inferd, err = filepath.Abs(inferd); err != nil {
		return err
	}
	if noop, err = filepath.Abs(noop); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	d := &daemon{bin: inferd, cfg: filepath.Join(dir, "inferd.yaml"), base: fmt.Sprintf("http://127.0.0.1:%d", port)}
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\ndataDir: %s/data\nreplica: {user: root}\nlog: {format: json, level: warn}\n", port, dir)
	if err := os.WriteFile(d.cfg, []byte(conf), 0o600); err != nil {
		return err
	}
	mf := filepath.Join(dir, "projects.yaml")
	if err := os.WriteFile(mf, fmt.Appendf(nil, `projects:
  - {id: llm, team: bench, modelKey: mk-llm, command: [%q], protocol: openai, healthPath: /healthz, inferPath: /, minReplicas: 1, maxReplicas: 1, concurrency: 16}
`, noop), 0o644); err != nil {
		return err
	}
	if out, err := exec.Command(inferd, "--config", d.cfg, "apply", "-f", mf).CombinedOutput(); err != nil {
		return fmt.Errorf("apply: %v: %s", err, out)
	}
	if err := d.start(filepath.Join(dir, "inferd.log")); err != nil {
		return err
	}
	defer d.stop()
	out, err := exec.Command(inferd, "--config", d.cfg, "key", "create", "--team", "bench").Output()
	if err != nil {
		return fmt.Errorf("key create: %w", err)
	}
	f := strings.Fields(string(out))
	d.key = f[len(f)-1]

	fmt.Println("| figure | measured | target | before |")
	fmt.Println("|---|---:|---|---|")
	idle, _ := payload.RSS(d.cmd.Process.Pid)
	big := `{"custom_id":"big","method":"POST","url":"/v1/chat/completions","body":{"model":"llm","messages":[],"pad":"` + strings.Repeat("x", 95<<20) + `"}}` + "\n"
	bigFile, err := d.upload(big)
	if err != nil {
		return err
	}
	big = ""
	for _, n := range []int{8, 16} {
		peak, answers, err := d.peakOf(func() map[string]int {
			return d.creates(n, func(int) string { return createBody(bigFile, "") })
		})
		if err != nil {
			return err
		}
		fmt.Printf("| Peak RSS, one key, %d creates at once of a 95 MiB one-line file (idle %s) | %s; answers %s | < 400 MiB, every client answered | 2.1 GB (8), 3.5–4.1 GB and clients cut (16) |\n",
			n, payload.MiB(idle), payload.MiB(peak), summary(answers))
	}

	small, err := d.upload(`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"llm","messages":[]}}` + "\n")
	if err != nil {
		return err
	}
	value := strings.Repeat("v", 9800000) // 9.4 MiB
	peak, answers, err := d.peakOf(func() map[string]int {
		return d.creates(100, func(int) string { return createBody(small, `,"metadata":{"k":"`+value+`"}`) })
	})
	if err != nil {
		return err
	}
	fmt.Printf("| Peak RSS, 100 creates with 9.4 MiB of metadata, 16 at a time | %s; answers %s | < 400 MiB, none kept | 1.77 GB, all kept |\n", payload.MiB(peak), summary(answers))

	// Ended batches with the most metadata OpenAI allows: 16 pairs of
	// 64-character keys and 512-character values.
	md := map[string]string{}
	for i := range 16 {
		md[fmt.Sprintf("%064d", i)] = strings.Repeat("m", 512)
	}
	mdJSON, _ := json.Marshal(md)
	var ids []string
	for i := range ended {
		status, b, err := d.post("/v1/batches", createBody(small, `,"metadata":`+string(mdJSON)))
		if err != nil || status != http.StatusOK {
			return fmt.Errorf("create ended batch %d: %d %s %v", i, status, b, err)
		}
		var v struct{ ID string }
		_ = json.Unmarshal(b, &v)
		ids = append(ids, v.ID)
	}
	for _, id := range ids {
		if err := d.waitEnded(id); err != nil {
			return err
		}
	}
	before, _ := payload.RSS(d.cmd.Process.Pid)
	onDisk := dirBytes(filepath.Join(dir, "data", "openai", "batches"))
	d.stop()
	if err := d.start(filepath.Join(dir, "inferd2.log")); err != nil {
		return err
	}
	after, _ := payload.RSS(d.cmd.Process.Pid)
	listed, err := d.listAll()
	if err != nil {
		return err
	}
	listedRSS, _ := payload.RSS(d.cmd.Process.Pid)
	fmt.Printf("| RSS after a restart with %d ended batches (16 × 576 characters of metadata each; %s of records on disk; %s before the restart) | %s at start, %s after listing all %d | | 1.17 GB after a restart (100 × 9.4 MiB) |\n",
		ended, payload.MiB(onDisk), payload.MiB(before), payload.MiB(after), payload.MiB(listedRSS), listed)
	return nil
}

func createBody(file, extra string) string {
	return `{"input_file_id":"` + file + `","endpoint":"/v1/chat/completions","completion_window":"24h"` + extra + `}`
}

func (d *daemon) start(logPath string) error {
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	d.cmd = exec.Command(d.bin, "--config", d.cfg, "serve")
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(d.base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("inferd not ready within 60 s (log: %s)", logPath)
		}
		time.Sleep(100 * time.Millisecond) // polls readiness; nothing is timed by it
	}
}

func (d *daemon) stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	_ = d.cmd.Wait()
	d.cmd = nil
}

// peakOf resets the daemon's peak RSS, runs fn, and returns the peak.
func (d *daemon) peakOf(fn func() map[string]int) (int64, map[string]int, error) {
	pid := d.cmd.Process.Pid
	if err := payload.ResetPeak(pid); err != nil {
		return 0, nil, err
	}
	answers := fn()
	peak, err := payload.Peak(pid)
	return peak, answers, err
}

// creates posts n creates, 16 at a time at most, and counts their answers
// by status and error code ("cut" for none).
func (d *daemon) creates(n int, body func(i int) string) map[string]int {
	var mu sync.Mutex
	answers := map[string]int{}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			status, raw, err := d.post("/v1/batches", body(i))
			what := "cut"
			if err == nil {
				var e struct{ Error struct{ Code string } }
				_ = json.Unmarshal(raw, &e)
				what = fmt.Sprintf("%d %s", status, e.Error.Code)
			}
			mu.Lock()
			answers[strings.TrimSpace(what)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return answers
}

func summary(answers map[string]int) string {
	var parts []string
	for k, v := range answers {
		parts = append(parts, fmt.Sprintf("%d × %s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func (d *daemon) post(path, body string) (int, []byte, error) {
	return d.do("POST", path, "application/json", strings.NewReader(body))
}

func (d *daemon) do(method, path, contentType string, body io.Reader) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, d.base+path, body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

func (d *daemon) upload(content string) (string, error) {
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = io.WriteString(fw, content)
	_ = mw.Close()
	status, raw, err := d.do("POST", "/v1/files", mw.FormDataContentType(), &form)
	if err != nil || status != http.StatusOK {
		return "", fmt.Errorf("upload: %d %s %v", status, raw, err)
	}
	var f struct{ ID string }
	err = json.Unmarshal(raw, &f)
	return f.ID, err
}

func (d *daemon) waitEnded(id string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		_, raw, err := d.do("GET", "/v1/batches/"+id, "", nil)
		if err != nil {
			return err
		}
		var b struct{ Status string }
		_ = json.Unmarshal(raw, &b)
		switch b.Status {
		case "completed", "failed", "expired", "cancelled":
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("batch " + id + " did not end within 5 minutes")
		}
		time.Sleep(50 * time.Millisecond) // polls the batch; nothing is timed by it
	}
}

// listAll pages through GET /v1/batches and returns how many it listed.
func (d *daemon) listAll() (int, error) {
	n, after := 0, ""
	for {
		path := "/v1/batches?limit=100"
		if after != "" {
			path += "&after=" + after
		}
		status, raw, err := d.do("GET", path, "", nil)
		if err != nil || status != http.StatusOK {
			return n, fmt.Errorf("list: %d %s %v", status, raw, err)
		}
		var p struct {
			Data    []struct{ ID string }
			HasMore bool `json:"has_more"`
			LastID  string
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return n, err
		}
		n += len(p.Data)
		if !p.HasMore || len(p.Data) == 0 {
			return n, nil
		}
		after = p.Data[len(p.Data)-1].ID
	}
}

func dirBytes(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			n += info.Size()
		}
	}
	return n
}
