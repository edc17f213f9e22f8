// Command eta measures how well a check's etaMs (issue #32) predicts when a
// queued call finishes, on a mixed workload: two projects of the echo model
// contend for three CPU slots, their calls take 50 to 500 ms each (drawn at
// random, seeded), and each round starts with one project scaled to zero, so
// its first calls wait on a cold boot. Every queued or booting call is
// checked every checkEvery; each check with an etaMs is one sample, its error
// |etaMs - (finish - check)| / (finish - check), where finish is when the
// call's long poll came back finished. It prints a Markdown section for
// docs/benchmarks.md.
//
//	go run ./bench/eta -inferd ./inferd [-rounds 3] [-calls 30]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	checkEvery = 150 * time.Millisecond
	minMs      = 50
	maxMs      = 500
)

func main() {
	inferd := flag.String("inferd", "./inferd", "inferd binary")
	rounds := flag.Int("rounds", 3, "rounds, each from a cold project")
	calls := flag.Int("calls", 30, "calls per project per round")
	flag.Parse()
	if err := run(*inferd, *rounds, *calls); err != nil {
		fmt.Fprintln(os.Stderr, "bench/eta:", err)
		os.Exit(1)
	}
}

const config = `listen: 127.0.0.1:%d
dataDir: %s/data
cpuSlots: 3
log: {level: warn, format: json}
replica: {user: %s}
`

// Project a boots in 2 s and goes back to zero replicas after 3 s idle, so
// each round begins with its cold boot; b boots in 1 s and stays.
const manifest = `projects:
  - id: a
    team: alpha
    modelKey: mk-eta-a
    command: ["python3", "server.py"]
    dir: %[1]s
    env: {BOOT_DELAY: "2"}
    maxReplicas: 2
    idleTimeout: 3
  - id: b
    team: beta
    modelKey: mk-eta-b
    command: ["python3", "server.py"]
    dir: %[1]s
    env: {BOOT_DELAY: "1"}
    maxReplicas: 2
    idleTimeout: 600
`

func run(bin string, rounds, calls int) error {
	bin, _ = filepath.Abs(bin)
	echo, err := filepath.Abs("examples/echo")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "inferd-eta-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	me, err := user.Current()
	if err != nil {
		return err
	}
	cfg := filepath.Join(dir, "inferd.yaml")
	mf := filepath.Join(dir, "projects.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, port, dir, me.Username), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(mf, fmt.Appendf(nil, manifest, echo), 0o644); err != nil {
		return err
	}
	if out, err := exec.Command(bin, "--config", cfg, "apply", "-f", mf).CombinedOutput(); err != nil {
		return fmt.Errorf("apply: %v: %s", err, out)
	}
	logf, err := os.Create(filepath.Join(dir, "inferd.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	srv := exec.Command(bin, "--config", cfg, "serve")
	srv.Stdout, srv.Stderr = logf, logf
	srv.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() }()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := waitReady(base); err != nil {
		return err
	}
	keys := map[string]string{}
	for _, team := range []string{"alpha", "beta"} {
		out, err := exec.Command(bin, "--config", cfg, "key", "create", "--team", team).Output()
		if err != nil {
			return fmt.Errorf("key create: %w", err)
		}
		f := strings.Fields(string(out))
		keys[team] = f[len(f)-1]
	}
	c := client{base: base, http: &http.Client{Timeout: time.Minute}}
	projects := []project{{"mk-eta-a", keys["alpha"]}, {"mk-eta-b", keys["beta"]}}

	// Warm-up: both projects boot once and run a few calls, so that their
	// boot and service times are measured, as on a box that has served.
	rng := rand.New(rand.NewPCG(32, 1))
	for _, p := range projects {
		for range 8 {
			if _, err := c.sync(p, rng.IntN(maxMs-minMs+1)+minMs); err != nil {
				return err
			}
		}
	}
	var samples []sample
	for r := range rounds {
		// a scales to zero (idleTimeout 3 s): its round starts cold.
		if err := c.waitNoReplicas(keys["alpha"], "a"); err != nil {
			return err
		}
		got, err := c.round(projects, calls, rand.New(rand.NewPCG(32, uint64(r+2))))
		if err != nil {
			return err
		}
		samples = append(samples, got...)
	}
	report(samples, rounds, calls)
	return nil
}

type project struct{ modelKey, key string }

type client struct {
	base string
	http *http.Client
}

// sample is one check of a pending call: its estimate (none: noETA) and
// what was left.
type sample struct {
	eta, actual time.Duration
	cause       string
	noETA       bool
}

func (s sample) err() float64 {
	return abs(float64(s.eta-s.actual)) / float64(s.actual)
}

func abs(x float64) float64 { return max(x, -x) }

type answer struct {
	Message    string `json:"message"`
	CallID     string `json:"callID"`
	EtaMs      *int64 `json:"etaMs"`
	WaitingFor *struct {
		Code string `json:"code"`
	} `json:"waitingFor"`
}

func (c client) post(path string, body any) (answer, error) {
	b, _ := json.Marshal(body)
	resp, err := c.http.Post(c.base+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	var a answer
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &a); err != nil {
		return a, fmt.Errorf("%s: %s", path, data)
	}
	return a, nil
}

func (c client) sync(p project, ms int) (answer, error) {
	a, err := c.post("/start/v4", map[string]any{"apiKey": p.key, "modelKey": p.modelKey,
		"modelInputs": map[string]any{"sleep": float64(ms) / 1000}})
	if err == nil && a.Message != "success" {
		err = fmt.Errorf("warm-up call: %s", a.Message)
	}
	return a, err
}

// round starts calls of each project at once, checks the pending ones
// every checkEvery, and returns the samples once all have finished.
func (c client) round(projects []project, calls int, rng *rand.Rand) ([]sample, error) {
	type pending struct {
		p        project
		id       string
		finished chan time.Time
	}
	var all []*pending
	for i := range calls {
		for _, p := range projects {
			_ = i
			ms := rng.IntN(maxMs-minMs+1) + minMs
			a, err := c.post("/start/v4", map[string]any{"apiKey": p.key, "modelKey": p.modelKey, "startOnly": true,
				"modelInputs": map[string]any{"sleep": float64(ms) / 1000}})
			if err != nil || a.CallID == "" {
				return nil, fmt.Errorf("start: %v %+v", err, a)
			}
			all = append(all, &pending{p: p, id: a.CallID, finished: make(chan time.Time, 1)})
		}
	}
	// Each call's long poll tells when it finished.
	for _, pc := range all {
		go func() {
			for {
				a, err := c.post("/check/v4", map[string]any{"apiKey": pc.p.key, "callID": pc.id, "longPoll": true})
				if err != nil || a.Message == "success" || strings.Contains(a.Message, "error") {
					pc.finished <- time.Now()
					return
				}
			}
		}()
	}
	type check struct {
		at    time.Time
		eta   time.Duration
		cause string
	}
	var mu sync.Mutex
	checks := map[*pending][]check{}
	done := map[*pending]time.Time{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for len(done) < len(all) {
		for _, pc := range all {
			if _, ok := done[pc]; ok {
				continue
			}
			select {
			case t := <-pc.finished:
				done[pc] = t
				continue
			default:
			}
			at := time.Now()
			a, err := c.post("/check/v4", map[string]any{"apiKey": pc.p.key, "callID": pc.id})
			if err != nil {
				return nil, err
			}
			if a.Message == "queued" || a.Message == "booting" {
				ch := check{at: at, eta: -1}
				if a.WaitingFor != nil {
					ch.cause = a.WaitingFor.Code
				}
				if a.EtaMs != nil {
					ch.eta = time.Duration(*a.EtaMs) * time.Millisecond
				}
				mu.Lock()
				checks[pc] = append(checks[pc], ch)
				mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("calls not finished in 5 minutes")
		case <-time.After(checkEvery):
		}
	}
	var out []sample
	for pc, cs := range checks {
		for _, ch := range cs {
			if left := done[pc].Sub(ch.at); left > 0 {
				out = append(out, sample{eta: ch.eta, actual: left, cause: ch.cause, noETA: ch.eta < 0})
			}
		}
	}
	return out, nil
}

func (c client) waitNoReplicas(key, project string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest("GET", c.base+"/v1/status/projects", nil)
		req.Header.Set("X-Service-API-Key", key)
		resp, err := c.http.Do(req)
		if err != nil {
			return err
		}
		var st struct {
			Results []struct {
				ID       string `json:"id"`
				Replicas []any  `json:"replicas"`
			} `json:"results"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			return err
		}
		for _, p := range st.Results {
			if p.ID == project && len(p.Replicas) == 0 {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("project %s did not scale to zero", project)
}

func waitReady(base string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("inferd not ready at %s", base)
}

// report prints the section: the median and 90th percentile of the
// relative error, overall and by waitingFor code.
func report(samples []sample, rounds, calls int) {
	by := map[string][]float64{}
	var all []float64
	without := 0
	for _, s := range samples {
		if s.noETA {
			without++
			continue
		}
		all = append(all, s.err())
		by[s.cause] = append(by[s.cause], s.err())
	}
	fmt.Printf("## Queue ETA accuracy\n\n")
	fmt.Printf("`go run ./bench/eta -inferd ./inferd` (in `make bench`): two projects of the echo model on 3 CPU slots, "+
		"%d rounds of %d calls each, every call 50–500 ms (uniform, seeded), project a cold (2 s boot) at the start of each round. "+
		"Error of one check: |etaMs − time left| / time left, time left = when its long poll came back finished − when it was checked.\n\n",
		rounds, 2*calls)
	fmt.Printf("| waitingFor | checks | median error | p90 error |\n|---|---:|---:|---:|\n")
	codes := make([]string, 0, len(by))
	for k := range by {
		codes = append(codes, k)
	}
	slices.Sort(codes)
	for _, k := range codes {
		fmt.Printf("| %s | %d | %.1f %% | %.1f %% |\n", k, len(by[k]), 100*quantile(by[k], 0.5), 100*quantile(by[k], 0.9))
	}
	fmt.Printf("| **all** | %d | **%.1f %%** | %.1f %% |\n\n", len(all), 100*quantile(all, 0.5), 100*quantile(all, 0.9))
	fmt.Printf("Checks of a pending call without an estimate: %d of %d.\n\n", without, len(samples))
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}
