// Command suite is what `make bench` runs: it starts a no-op model server,
// nginx as a keep-alive reverse proxy in front of it, and inferd with
// projects pointing at the same no-op server, then measures them side by
// side with one load generator and prints a Markdown report (figures and
// ratios) to stdout. Everything runs on loopback, as the current user, in a
// temporary directory that is removed at the end.
//
//	go run ./bench/suite -inferd ./inferd -noop ./noop [-nginx /usr/sbin/nginx] [-quick]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"inferd/bench/payload"
	inferdmanifest "inferd/manifest"
	"inferd/store"
)

type options struct {
	inferd, noop, nginx string
	phase               time.Duration // length of one measured slice
	rounds              int           // slices per target, interleaved
	fill                int           // finished calls to store for the memory figure
	polls               int           // concurrent long polls
	keep                bool
	only                string // comma-separated step names to run; "" = all
	profile             string // directory for the daemon's profiles under load; "" = none
	quick               bool   // make bench-quick: the hot path's figures only, short slices
	examples            string // the repository's examples/ (the batching example's model)
	baseline            bool   // this is the -vs daemon's setup (its manifest keeps to what older builds read)
	vs                  string // a second inferd binary (main's, say) measured beside -inferd in the hot path's steps
}

func main() {
	var o options
	flag.StringVar(&o.inferd, "inferd", "./inferd", "inferd binary")
	flag.StringVar(&o.noop, "noop", "./noop", "no-op model binary (go build ./bench/noop)")
	flag.StringVar(&o.nginx, "nginx", "/usr/sbin/nginx", "nginx binary")
	flag.DurationVar(&o.phase, "phase", 3*time.Second, "length of one measured slice")
	flag.IntVar(&o.rounds, "rounds", 3, "slices per target, interleaved across targets")
	flag.IntVar(&o.fill, "fill", 100000, "finished calls to store before the memory figure")
	flag.IntVar(&o.polls, "polls", 10000, "concurrent long polls to hold")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (logs, data file)")
	flag.StringVar(&o.only, "only", "", "run only these steps, comma-separated words of their names (e.g. \"cold,throughput\")")
	flag.StringVar(&o.profile, "profile", "", "save inferd's CPU, block and mutex profiles and a trace of each inferd slice here (needs a build with -tags pprof)")
	flag.StringVar(&o.examples, "examples", "examples", "the repository's examples directory (the batching step runs examples/batch)")
	flag.StringVar(&o.vs, "vs", "", "a second inferd binary (the baseline: main's build, say) to measure beside -inferd, interleaved, in the hot path's steps")
	flag.BoolVar(&o.quick, "quick", false, "only the hot path's figures, one interleaved run (make bench-quick; -phase 1s -rounds 2 unless given)")
	copyServer := flag.Int("copy-server", 0, "internal: serve the io.Copy baseline of this many bytes (a helper process of the payload step)")
	goHopPort := flag.Int("go-hop", 0, "internal: serve the Go hop on this port (a helper process: see gohop.go)")
	goHopUpstream := flag.String("go-hop-upstream", "", "internal: the model the Go hop forwards to (host:port)")
	goHopLog := flag.String("go-hop-log", "", "internal: the durable Go hop's log file")
	flag.Parse()
	if o.quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["phase"] {
			o.phase = time.Second
		}
		if !set["rounds"] {
			o.rounds = 2
		}
	}
	if *copyServer > 0 {
		fmt.Fprintln(os.Stderr, payload.ListenAndServeCopy(os.Stdout, *copyServer))
		os.Exit(1)
	}
	if *goHopPort > 0 {
		fmt.Fprintln(os.Stderr, "go hop:", serveGoHop(*goHopPort, *goHopUpstream, *goHopLog))
		os.Exit(1)
	}
	o.inferd, o.noop, o.examples = mustAbs(o.inferd), mustAbs(o.noop), mustAbs(o.examples)
	if o.vs != "" {
		o.vs = mustAbs(o.vs)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	raiseNoFile()
	dir, err := os.MkdirTemp("", "inferd-bench-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "bench: working directory", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	e, err := setUp(ctx, o, dir)
	if e != nil {
		defer e.tearDown()
	}
	if err != nil {
		return err
	}
	rep := &report{}
	rep.machine()
	type step struct {
		name string
		fn   func(context.Context, *env, options, *report) error
	}
	steps := []step{
		{"idle memory", measureIdle},
		{"large payloads: queue and checks", measurePayloads},
		{"latency, concurrency 1", measureLatency},
		{"throughput, concurrency 16", measureConcurrency16},
		{"openai door: CPU per call", measureOpenAIDoor},
		{"throughput, no-op model, concurrency 64", measureThroughputNoop},
		{"throughput, 10 ms model, concurrency 64", measureThroughput10ms},
		{"batching: 20 ms + 1 ms per call model", measureBatching},
		{"batching example: Python, default backlog", measureBatchingExample},
		{"cluster: 3 nodes vs single box", measureCluster},
		{"cold boot", measureColdBoot},
		{"cold boot, quiet model", measureColdBootQuiet},
		{"cold boot, sandbox off", measureColdBootSandboxOff},
		{"scale-up under a burst", measureBurst},
		{"stored calls: memory and file size", measureFill},
		{"long-poll capacity", measureLongPolls},
		{"edge budgets: held bodies", measureHeldBodies},
		{"edge budgets: silent event streams", measureSilentStreams},
		{"edge budgets: healthz under slow senders", measureHealthzUnderSlowSenders},
	}
	if o.quick {
		steps = steps[:0]
		steps = append(steps, step{"hot path, quick", measureQuick}, step{"cluster, quick", measureClusterQuick})
	}
	for _, s := range steps {
		if !o.selected(s.name) {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s ...\n", s.name)
		t := time.Now()
		if err := s.fn(ctx, e, o, rep); err != nil {
			rep.errorf("%s: %v", s.name, err)
			fmt.Fprintf(os.Stderr, "bench: %s failed: %v\n", s.name, err)
		}
		fmt.Fprintf(os.Stderr, "bench: %s done in %v\n", s.name, time.Since(t).Round(time.Millisecond))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	rep.print(os.Stdout)
	if len(rep.errors) > 0 {
		return fmt.Errorf("%d measurements failed", len(rep.errors))
	}
	return nil
}

// selected reports whether step name is to run: every step without -only, or one
// whose name contains a word of -only.
func (o options) selected(name string) bool {
	if o.only == "" {
		return true
	}
	for w := range strings.SplitSeq(o.only, ",") {
		if w != "" && strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// raiseNoFile lifts the soft open-file limit to the hard one, for this
// process and the inferd it starts (10k long polls need 10k sockets on each
// side). Go does this for its own process; children get the old limit back
// unless it is set explicitly.
func raiseNoFile() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

// env is everything the suite started.
type env struct {
	dir               string
	procs             []*proc
	direct, direct10  string // no-op model URLs (0 ms and 10 ms per call)
	nginx             string // nginx in front of direct
	goHop             string // the Go hop in front of direct (gohop.go)
	goHopPid          int
	durableHop        string // the durable Go hop in front of direct (gohop.go)
	durableHopPid     int
	base              string // inferd's base URL
	apiKey            string
	inferdPid         int
	gate              string // created to let project bigq boot
	dbPath            string
	coldLog, burstLog string
	coldQuietLog      string
	inferdCfg         string
	port              int               // inferd's
	pprof             string            // the address inferd serves profiles on (-profile)
	projects          []store.Project   // the manifest's, as apply reads it
	vs                *env              // the -vs inferd: its own directory, data and port; nil without -vs
	teamKeys          map[string]string // keys of the OpenAI door's teams, by team (openai.go)
}

// alwaysOn returns how many replicas the projects keep running at all times
// (the sum of their minReplicas).
func (e *env) alwaysOn() int {
	n := 0
	for _, p := range e.projects {
		n += p.MinReplicas
	}
	return n
}

func (e *env) tearDown() {
	for i := len(e.procs) - 1; i >= 0; i-- {
		e.procs[i].stop()
	}
}

func setUp(ctx context.Context, o options, dir string) (*env, error) {
	e := &env{dir: dir, coldLog: filepath.Join(dir, "cold.boots"), coldQuietLog: filepath.Join(dir, "coldquiet.boots"),
		burstLog: filepath.Join(dir, "burst.boots")}
	// Two no-op model servers the clients call directly (and nginx proxies).
	for _, m := range []struct {
		url   *string
		delay string
	}{{&e.direct, "0"}, {&e.direct10, "10ms"}} {
		port, err := freePort()
		if err != nil {
			return e, err
		}
		p, err := start("noop", filepath.Join(dir, "noop-"+m.delay+".log"),
			[]string{fmt.Sprintf("PORT=%d", port), "NOOP_DELAY=" + m.delay}, o.noop)
		if err != nil {
			return e, err
		}
		e.procs = append(e.procs, p)
		*m.url = fmt.Sprintf("http://127.0.0.1:%d/", port)
		if err := waitHTTP(ctx, "GET", *m.url+"healthz", 10*time.Second); err != nil {
			return e, err
		}
	}
	if err := startNginx(ctx, o, e); err != nil {
		return e, err
	}
	if err := startGoHops(ctx, e); err != nil {
		return e, err
	}
	if err := startInferd(ctx, o, e); err != nil {
		return e, err
	}
	return e, startVs(ctx, o, e)
}

// systemPython is the python3 the batching example runs on: the system's,
// which every uid may run (a pyenv under /root is not), else python3 on PATH.
func systemPython() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

// startVs starts the -vs inferd beside the first, with the same
// configuration and projects in a directory of its own.
func startVs(ctx context.Context, o options, e *env) error {
	if o.vs == "" {
		return nil
	}
	v := &env{dir: filepath.Join(e.dir, "vs"), direct: e.direct, direct10: e.direct10}
	v.coldLog, v.coldQuietLog, v.burstLog = filepath.Join(v.dir, "cold.boots"), filepath.Join(v.dir, "coldquiet.boots"), filepath.Join(v.dir, "burst.boots")
	if err := os.Mkdir(v.dir, 0o755); err != nil {
		return err
	}
	vo := o
	vo.inferd, vo.profile, vo.baseline = o.vs, "", true
	err := startInferd(ctx, vo, v)
	e.procs = append(e.procs, v.procs...) // stopped with the rest
	e.vs = v
	return err
}

const nginxConf = `daemon off;
master_process on;
worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 20000; }
http {
  access_log off;
  client_body_temp_path %[1]s/nginx-body;
  proxy_temp_path %[1]s/nginx-proxy;
  fastcgi_temp_path %[1]s/nginx-fastcgi;
  uwsgi_temp_path %[1]s/nginx-uwsgi;
  scgi_temp_path %[1]s/nginx-scgi;
  upstream model { server 127.0.0.1:%[2]s; keepalive 128; }
  server {
    listen 127.0.0.1:%[3]d;
    location / {
      proxy_pass http://model;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`

// startNginx runs nginx as a reverse proxy to the 0 ms model, with
// keep-alive connections to it (nginx's own recommended upstream setup).
func startNginx(ctx context.Context, o options, e *env) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	upstream := strings.TrimSuffix(strings.TrimPrefix(e.direct, "http://127.0.0.1:"), "/")
	conf := filepath.Join(e.dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, e.dir, upstream, port), 0o644); err != nil {
		return err
	}
	args := []string{o.nginx, "-p", e.dir, "-c", conf, "-e", filepath.Join(e.dir, "nginx-error.log")}
	if out, err := exec.Command(args[0], append(args[1:], "-t")...).CombinedOutput(); err != nil {
		return fmt.Errorf("nginx -t: %v: %s", err, out)
	}
	p, err := start("nginx", filepath.Join(e.dir, "nginx.log"), nil, args...)
	if err != nil {
		return err
	}
	e.procs = append(e.procs, p)
	e.nginx = fmt.Sprintf("http://127.0.0.1:%d/", port)
	return waitHTTP(ctx, "GET", e.nginx+"healthz", 10*time.Second)
}

const inferdConf = `listen: 127.0.0.1:%d
dataDir: %s/data
log: {level: warn, format: json}
longPollWait: 300s
maxQueuedPerProject: 20000
cpuSlots: 64
sweepInterval: 1h
# The harness is the only client: abuse limits would cap what it measures.
limits: {requestsPerSecond: 0, maxWaitsPerKey: 0, maxWaits: 0}
%s`

// The replica settings of inferdConf: the default sandbox (as far as the
// harness's privileges allow: all of it as root), or none of it, for the
// cold-boot figure side by side.
const (
	sandboxOn  = ""
	sandboxOff = "replica: {user: root, network: host, cgroups: false}\n"
)

// The projects, all on the no-op model. cold, coldquiet (a model that prints
// nothing once listening) and burst scale to zero at once when idle; hang never answers, so its calls wait for the long-poll figure.
// pass1 and pass16 are one model that costs 20 ms + 1 ms per call, one pass
// at a time (a GPU's forward pass), without and with batching.
const manifest = `projects:
  - {id: noop, team: bench, modelKey: mk-noop, command: [%[1]q], concurrency: 64, minReplicas: 1, maxReplicas: 1, bootTimeout: 30}
  - {id: noopans, team: bench, modelKey: mk-noopans, command: [%[1]q], concurrency: 64, minReplicas: 1, maxReplicas: 1, bootTimeout: 30, durability: answered}
  - {id: noop10, team: bench, modelKey: mk-noop10, command: [%[1]q], env: {NOOP_DELAY: 10ms}, concurrency: 64, minReplicas: 1, maxReplicas: 1, bootTimeout: 30}
  - {id: noop10x4, team: bench, modelKey: mk-noop10x4, command: [%[1]q], env: {NOOP_DELAY: 10ms}, concurrency: 16, minReplicas: 4, maxReplicas: 4, bootTimeout: 30}
  - {id: cold, team: bench, modelKey: mk-cold, command: [%[1]q], env: {NOOP_BOOTLOG: %[2]q}, concurrency: 1, minReplicas: 0, maxReplicas: 1, idleTimeout: 0, bootTimeout: 30}
  - {id: coldquiet, team: bench, modelKey: mk-coldquiet, command: [%[1]q], env: {NOOP_BOOTLOG: %[4]q, NOOP_QUIET: "1"}, concurrency: 1, minReplicas: 0, maxReplicas: 1, idleTimeout: 0, bootTimeout: 30}
  - {id: burst, team: bench, modelKey: mk-burst, command: [%[1]q], env: {NOOP_BOOTLOG: %[3]q, NOOP_DELAY: 200ms}, concurrency: 1, minReplicas: 0, maxReplicas: 4, idleTimeout: 0, bootTimeout: 30}
  - {id: hang, team: bench, modelKey: mk-hang, command: [%[1]q], env: {NOOP_DELAY: 1h}, concurrency: 1, minReplicas: 1, maxReplicas: 1, inferenceTimeout: 86400, bootTimeout: 30}
  - {id: bigq, team: bench, modelKey: mk-bigq, command: ["sh", "-c", %[5]q], concurrency: 1, minReplicas: 0, maxReplicas: 1, bootTimeout: 600}
  - {id: bigr, team: bench, modelKey: mk-bigr, command: [%[1]q], env: {NOOP_REPLY_BYTES: "%[6]d"}, concurrency: 32, minReplicas: 0, maxReplicas: 1, bootTimeout: 30}
  - {id: pass1, team: bench, modelKey: mk-pass1, command: [%[1]q], env: {NOOP_DELAY: 20ms, NOOP_ITEM_DELAY: 1ms, NOOP_SERIAL: "1"}, concurrency: 1, minReplicas: 0, maxReplicas: 1, idleTimeout: 600, bootTimeout: 30}
  - {id: pass16, team: bench, modelKey: mk-pass16, command: [%[1]q], env: {NOOP_DELAY: 20ms, NOOP_ITEM_DELAY: 1ms, NOOP_SERIAL: "1"}, batchPath: /batch, batch: {maxSize: 16, maxWaitMs: %[7]d}, concurrency: 1, minReplicas: 0, maxReplicas: 1, idleTimeout: 600, bootTimeout: 30}
  - {id: huge, team: bench, modelKey: mk-huge, command: [%[1]q], env: {NOOP_REPLY_BYTES: "%[8]d"}, concurrency: 1, minReplicas: 0, maxReplicas: 1, bootTimeout: 30}
  - {id: pyone, team: bench, modelKey: mk-pyone, command: [%[10]q, "server.py"], dir: %[9]q, concurrency: 64, minReplicas: 0, maxReplicas: 1, idleTimeout: 600, bootTimeout: 30}
  - {id: pybatch, team: bench, modelKey: mk-pybatch, command: [%[10]q, "server.py"], dir: %[9]q, batchPath: /batch, batch: {maxSize: 16, maxWaitMs: %[7]d}, concurrency: 1, minReplicas: 0, maxReplicas: 1, idleTimeout: 600, bootTimeout: 30}
`

func startInferd(ctx context.Context, o options, e *env) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	e.inferdCfg = filepath.Join(e.dir, "inferd.yaml")
	e.port = port
	if err := e.writeConfig(sandboxOn); err != nil {
		return err
	}
	// Models run under uids of their own as root: they must reach their
	// boot logs in the harness's directory.
	if err := os.Chmod(e.dir, 0o755); err != nil {
		return err
	}
	for _, f := range []string{e.coldLog, e.coldQuietLog, e.burstLog} {
		if err := os.WriteFile(f, nil, 0o666); err != nil {
			return err
		}
		if err := os.Chmod(f, 0o666); err != nil { // past the umask
			return err
		}
	}
	mf := filepath.Join(e.dir, "projects.yaml")
	// bigq's model boots only once the gate file exists (measurePayloads).
	e.gate = filepath.Join(e.dir, "bigq.gate")
	gated := fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; exec %s", e.gate, o.noop)
	data := fmt.Appendf(nil, manifest, o.noop, e.coldLog, e.burstLog, e.coldQuietLog, gated, payloadSize, batchMaxWaitMs, bigResultBytes, o.examples+"/batch", systemPython())
	data = append(data, openaiManifest(o.noop)...)
	if o.baseline {
		// The -vs build may predate durability: keep to what it reads.
		var kept []string
		for _, l := range strings.SplitAfter(string(data), "\n") {
			if !strings.Contains(l, "durability: answered") {
				kept = append(kept, l)
			}
		}
		data = []byte(strings.Join(kept, ""))
	}
	if err := os.WriteFile(mf, data, 0o644); err != nil {
		return err
	}
	if e.projects, err = inferdmanifest.Parse(data, e.dir); err != nil {
		return fmt.Errorf("bench manifest: %w", err)
	}
	if out, err := exec.Command(o.inferd, "--config", e.inferdCfg, "apply", "-f", mf).CombinedOutput(); err != nil {
		return fmt.Errorf("inferd apply: %v: %s", err, out)
	}
	e.base = fmt.Sprintf("http://127.0.0.1:%d", port)
	e.dbPath = filepath.Join(e.dir, "data", "inferd.db")
	if err := serveInferd(ctx, o, e); err != nil {
		return err
	}
	out, err := exec.Command(o.inferd, "--config", e.inferdCfg, "key", "create", "--team", "bench").Output()
	if err != nil {
		return fmt.Errorf("inferd key create: %w", err)
	}
	lines := strings.Fields(strings.TrimSpace(string(out)))
	e.apiKey = lines[len(lines)-1]
	if err := openaiKeys(o, e); err != nil {
		return err
	}
	return waitAlwaysOn(ctx, e)
}

// writeConfig writes inferd's configuration with the replica settings given
// (sandboxOn or sandboxOff); a restart applies it.
func (e *env) writeConfig(replica string) error {
	return os.WriteFile(e.inferdCfg, fmt.Appendf(nil, inferdConf, e.port, e.dir, replica), 0o644)
}

// waitAlwaysOn waits until every replica that should always run (each
// project's minReplicas) is up.
func waitAlwaysOn(ctx context.Context, e *env) error {
	for _, p := range e.projects {
		if p.MinReplicas == 0 {
			continue
		}
		n := float64(p.MinReplicas)
		if _, err := waitReplicas(ctx, e.base, p.ID, "ready", 30*time.Second, func(v float64) bool { return v >= n }); err != nil {
			return err
		}
	}
	return nil
}

// serveInferd starts inferd serve on the prepared configuration and waits
// until it answers /readyz.
func serveInferd(ctx context.Context, o options, e *env) error {
	env, err := o.pprofEnv(e)
	if err != nil {
		return err
	}
	p, err := start("inferd", filepath.Join(e.dir, "inferd.log"), env, o.inferd, "--config", e.inferdCfg, "serve")
	if err != nil {
		return err
	}
	e.procs = append(e.procs, p)
	e.inferdPid = p.pid()
	return waitHTTP(ctx, "GET", e.base+"/readyz", 30*time.Second)
}

// restartInferd stops inferd (SIGTERM, as systemd would) and starts it again
// on the same data file, then waits for the always-on replicas.
func restartInferd(ctx context.Context, o options, e *env) error {
	for i, p := range e.procs {
		if p.pid() == e.inferdPid {
			p.stop()
			e.procs = append(e.procs[:i], e.procs[i+1:]...)
			break
		}
	}
	if err := serveInferd(ctx, o, e); err != nil {
		return err
	}
	return waitAlwaysOn(ctx, e)
}

// waitReplicas waits until the number of the project's replicas in state
// ("" = any state) satisfies ok.
func waitReplicas(ctx context.Context, base, project, state string, timeout time.Duration, ok func(float64) bool) (float64, error) {
	return waitMetric(ctx, base, `inferd_replicas{project="`+project+`",state="`+state, timeout, ok)
}
