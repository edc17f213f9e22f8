package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/httpapi"
	"inferd/internal/testenv"
)

// TestModelProcessesAreConfined runs the echo model through a live daemon
// and asks it what it can see: no inferd secret in its environment, told to
// listen on loopback, and, when inferd runs as root, an unprivileged uid of
// its project's own that cannot read the data file. (TestTeamsAreContained
// has the two-team attacks.)
func TestModelProcessesAreConfined(t *testing.T) {
	t.Parallel()
	echo := readableEcho(t)
	dir, cfg := newDaemonDir(t, "")
	// The default replica.user (per-project); the environment carries INFERD_SECRET_PROBE.
	d := startDaemonEnv(t, dir, cfg)
	key := d.createKey("acme", false)
	mark := marker()
	d.apply(strings.Replace("projects:\n"+echoProject("echo", "acme", "mk-echo", echo, mark, `, PROJECT_SETTING: "x"`),
		`["python3"`, `["/usr/bin/python3"`, 1))
	c := inferenceClient{t: t, base: d.base, key: key}
	dbPath := filepath.Join(dir, "data", "inferd.db")
	r := c.start("mk-echo", fmt.Sprintf(`{"whoami": true, "read": %q}`, dbPath), false)
	if r["message"] != "success" {
		t.Fatalf("call: %v", r)
	}
	out := output(t, r)

	t.Run("environment holds only the allowlist, the project's env and inferd's variables", func(t *testing.T) {
		allowed := map[string]bool{
			"PATH": true, "HOME": true, "USER": true, "LOGNAME": true, "LANG": true, "LC_ALL": true, "LC_CTYPE": true,
			"TZ": true, "TMPDIR": true, "PYENV_ROOT": true, "PYENV_VERSION": true, "PYTHONUNBUFFERED": true,
			"HOST": true, "PORT": true, "CUDA_VISIBLE_DEVICES": true, "NVIDIA_VISIBLE_DEVICES": true,
			"INFERD_PROJECT_ID": true, "INFERD_REPLICA_ID": true, "E2E_MARKER": true, "PROJECT_SETTING": true,
			"LD_LIBRARY_PATH": true, // replica.passEnv's default, when inferd has it
		}
		for _, name := range out["environ"].([]any) {
			if !allowed[name.(string)] {
				t.Errorf("the model sees %s", name)
			}
		}
		if out := output(t, c.start("mk-echo", `{"env": "HOST"}`, false)); out["env"] != "127.0.0.1" {
			t.Errorf("HOST = %v, want 127.0.0.1", out["env"])
		}
	})
	t.Run("runs as an unprivileged uid of the project's own when inferd is root", func(t *testing.T) {
		testenv.NeedRoot(t, "inferd runs models as an unprivileged user only as root")
		if uid := int(out["uid"].(float64)); uid < 61184 || uid > 65519 || int(out["gid"].(float64)) != uid {
			t.Fatalf("model uid %d gid %v, want a uid (and gid) of replica.uidRange 61184-65519", uid, out["gid"])
		}
		if _, err := user.LookupId(strconv.Itoa(int(out["uid"].(float64)))); err == nil {
			t.Fatalf("model uid %v belongs to a user of the system", out["uid"])
		}
		if got := out["read"]; got != "error: Permission denied" {
			t.Fatalf("the model reading the data file: %v", got)
		}
	})
	// inferd still stops what runs as another user.
	d.stop()
	eventually(t, 10*time.Second, "no model process after shutdown", func() bool { return len(processesWithEnv(mark)) == 0 })
}

// readableEcho copies the echo model to a directory any user can read, so
// that it runs as an unprivileged user wherever the checkout lives (see
// readableModel).
func readableEcho(t *testing.T) string {
	t.Helper()
	return readableModel(t, filepath.Join(echoDir(t), "server.py"))
}

// readableModel copies the model program src to server.py in a directory any
// user can read, and checks that the system python3 exists (a pyenv one
// under /root would not be readable by a model's uid), so that it runs under
// a uid of its own wherever the checkout lives.
func readableModel(t *testing.T, src string) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		testenv.Missing(t, "/usr/bin/python3, for an unprivileged model user to run")
	}
	code, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // t.TempDir makes them 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "server.py"), code, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestAbuseLimitsEndToEnd drives each limit through a live daemon.
func TestAbuseLimitsEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, `maxBodyBytes: 2048
limits:
  requestsPerSecond: 0.001
  burst: 3
  maxInputDepth: 4
  readHeaderTimeout: 1s
`)
	d := startDaemon(t, dir, cfg)
	d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, marker(), ""))
	hdr := func(k string) map[string]string { return map[string]string{"X-Service-API-Key": k} }

	t.Run("per-key request rate: 429 on the project API, an error on start", func(t *testing.T) {
		key := d.createKey("acme", false)
		for i := 0; i < 3; i++ {
			if status, body := do(t, "GET", d.base+"/v1/projects", hdr(key), ""); status != 200 {
				t.Fatalf("request %d within the burst: %d %v", i+1, status, body)
			}
		}
		status, body := do(t, "GET", d.base+"/v1/projects", hdr(key), "")
		if e, _ := body["error"].(map[string]any); status != 429 || e["code"] != "rate_limited" {
			t.Fatalf("over the rate: %d %v", status, body)
		}
		_, r := do(t, "POST", d.base+"/start/v4", nil, fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","modelInputs":{}}`, key))
		if msg := r["message"].(string); !strings.HasPrefix(msg, "error: rate limit exceeded") {
			t.Fatalf("start over the rate: %q", msg)
		}
		if status, _ := do(t, "GET", d.base+"/v1/projects", hdr(d.createKey("acme", false)), ""); status != 200 {
			t.Fatalf("another key of the same team is limited too: %d", status)
		}
	})
	t.Run("body size and input depth", func(t *testing.T) {
		key := d.createKey("acme", false)
		start := func(inputs string) string {
			_, r := do(t, "POST", d.base+"/start/v4", nil, fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","startOnly":true,"modelInputs":%s}`, key, inputs))
			return r["message"].(string)
		}
		if msg := start(`{"pad":"` + strings.Repeat("x", 4096) + `"}`); msg != "error: request body is larger than 2048 bytes" {
			t.Errorf("big body: %q", msg)
		}
		if msg := start(`{"a":{"b":{"c":{"d":{}}}}}`); msg != "error: modelInputs nest deeper than 4 levels" {
			t.Errorf("deep inputs: %q", msg)
		}
		if status, _ := do(t, "PUT", d.base+"/v1/projects/echo", hdr(key), `{"maxReplicas":2,"x":"`+strings.Repeat("x", 4096)+`"}`); status != 413 {
			t.Errorf("big PUT: %d", status)
		}
	})
	t.Run("slow clients cannot hold the server", func(t *testing.T) {
		const slow = 100
		addr := strings.TrimPrefix(d.base, "http://")
		var conns []net.Conn
		for i := 0; i < slow; i++ {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			// Half a request line and never the rest: the slowloris pattern.
			if _, err := io.WriteString(conn, "POST /start/v4 HTTP/1.1\r\nHost: x\r\nX-Slow: "); err != nil {
				t.Fatal(err)
			}
			conns = append(conns, conn)
		}
		// A trickler that sends one header byte at a time is cut off too:
		// the timeout bounds the whole header, not the gap between bytes.
		trickle, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { trickle.Close() })
		io.WriteString(trickle, "GET /healthz HTTP/1.1\r\n")
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				if _, err := trickle.Write([]byte("X")); err != nil {
					return // the server closed it
				}
				time.Sleep(50 * time.Millisecond) // the trickle itself, not synchronization
			}
		})

		// While they all hang on, others are served.
		key := d.createKey("acme", false)
		if status, _ := do(t, "GET", d.base+"/healthz", nil, ""); status != 200 {
			t.Fatalf("healthz while slow clients hold connections: %d", status)
		}
		if status, _ := do(t, "GET", d.base+"/v1/projects", hdr(key), ""); status != 200 {
			t.Fatalf("project API while slow clients hold connections: %d", status)
		}
		// And the server drops every slow connection (readHeaderTimeout 1s);
		// the 60 s deadline only guards against a server that never does.
		for i, conn := range append(conns, trickle) {
			conn.SetReadDeadline(time.Now().Add(testenv.Scale(60 * time.Second)))
			_, err := io.ReadAll(conn)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("slow connection %d still open after 60s", i)
			}
		}
		trickle.Close()
		wg.Wait()
	})
}

// TestConnectionFloodLeavesHealthzAndReplicaBoots runs the daemon with a
// small open-file limit (256, so the default connection cap is 128) and
// opens 400 connections that never send a byte, more than the daemon has
// descriptors. Uncapped, accept ran out of descriptors and the next replica
// boot failed with "pipe2: too many open files". Capped, the oldest silent
// connections make room for new ones: /healthz answers, a call boots a
// replica and succeeds, and /metrics shows the connections within the cap.
func TestConnectionFloodLeavesHealthzAndReplicaBoots(t *testing.T) {
	t.Parallel()
	const fileLimit, flood = 256, 400
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(60*time.Second)+"\n")
	cmd := exec.Command("sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, fileLimit),
		inferdBin, "--config", cfg, "serve")
	cmd.Env = append(os.Environ(), "INFERD_REPLICA_USER=root")
	d := startDaemonCmd(t, cmd, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("flood", "acme", "mk-flood", echo, marker(), "") + "    maxReplicas: 1\n")

	addr := strings.TrimPrefix(d.base, "http://")
	for i := range flood {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d of the flood: %v", i, err)
		}
		defer c.Close()
	}
	metric := func(name string) int {
		v, ok := scrapeMetrics(t, d.base)[name]
		if !ok {
			t.Fatalf("/metrics has no %s", name)
		}
		return int(v)
	}
	capped := httpapi.DefaultMaxConnections(fileLimit)
	// Every flood connection has been accepted once all but the cap's worth
	// were closed to make room (each scrape adds one of its own).
	eventually(t, time.Minute, "the daemon to take in the whole flood", func() bool {
		return metric("inferd_connections_closed_for_room_total") >= flood-capped
	})
	if status, body := doRaw(t, "GET", d.base+"/healthz", nil, ""); status != 200 {
		t.Fatalf("/healthz under the flood: %d %s", status, body)
	}
	c := inferenceClient{t: t, base: d.base, key: key}
	if r := c.start("mk-flood", `{"i":1}`, false); r["message"] != "success" {
		t.Fatalf("a call that boots a replica under the flood: %v", r)
	}
	open, most := metric("inferd_connections_open"), metric("inferd_connections_max")
	if most != capped || open > most {
		t.Errorf("/metrics: %d connections open, cap %d; want the cap %d sized from the limit of %d files and no more open",
			open, most, capped, fileLimit)
	}
	if log := d.logs.String(); strings.Contains(log, "too many open files") {
		t.Errorf("the daemon ran out of file descriptors:\n%s", log)
	}
	report(t, "%d silent connections against an open-file limit of %d: cap %d (default sizing), %d open after, "+
		"%d closed to make room; /healthz answered and a replica booted and served a call",
		flood, fileLimit, most, open, metric("inferd_connections_closed_for_room_total"))
}
