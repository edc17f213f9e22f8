package local

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"inferd/internal/testenv"
)

func TestBootWatchExplainsEachFailedCheck(t *testing.T) {
	refused := fmt.Errorf("health check: dial: %w", syscall.ECONNREFUSED)
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name      string
		listening []int
		status    int
		err       error
		want      string
		hopeless  bool // fatal once it has held for hopelessAfter
	}{
		{"wrong port", []int{5000}, 0, refused,
			"no answer on 127.0.0.1:41000 (the model must listen on $PORT); it listens on 5000", true},
		{"two wrong ports", []int{5000, 8081}, 0, refused,
			"no answer on 127.0.0.1:41000 (the model must listen on $PORT); it listens on 5000, 8081", true},
		{"not listening yet", nil, 0, refused,
			"no answer on 127.0.0.1:41000 (the model must listen on $PORT); it listens on no TCP port yet", false},
		{"right port, other address", []int{41000}, 0, refused,
			"no answer on 127.0.0.1:41000 (the model must listen on $PORT); it listens on that port but not on 127.0.0.1 (listen on $HOST)", false},
		{"health path missing", nil, 404, nil, "GET /healthz answered 404 (set healthPath)", true},
		{"health method refused", nil, 405, nil, "GET /healthz answered 405 (set healthPath)", true},
		{"no GET at all", nil, 501, nil, "GET /healthz answered 501 (set healthPath)", true},
		{"still loading", nil, 503, nil, "GET /healthz answered 503", false},
		{"no answer in time", nil, 0, context.DeadlineExceeded, "GET /healthz got no answer within 1s", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &bootWatch{port: 41000, pgid: 7, healthPath: "/healthz", listening: func(pgid int) ([]int, error) {
				if pgid != 7 {
					t.Errorf("listening(%d), want the replica's group 7", pgid)
				}
				return tc.listening, nil
			}}
			first := w.observe(t0, tc.status, tc.err)
			if first.Text != tc.want || first.Fatal {
				t.Fatalf("first finding = %+v, want %q, not fatal", first, tc.want)
			}
			if got := w.observe(t0.Add(hopelessAfter-time.Millisecond), tc.status, tc.err); got.Fatal {
				t.Fatalf("fatal before it held for %v", hopelessAfter)
			}
			if got := w.observe(t0.Add(hopelessAfter), tc.status, tc.err); got.Fatal != tc.hopeless {
				t.Fatalf("after %v: fatal = %v, want %v", hopelessAfter, got.Fatal, tc.hopeless)
			}
		})
	}
}

func TestBootWatchStartsOverWhenTheFindingChanges(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := &bootWatch{port: 41000, healthPath: "/healthz", listening: func(int) ([]int, error) { return nil, nil }}
	w.observe(t0, 404, nil)
	w.observe(t0.Add(time.Second), 503, nil) // the model moved on
	if got := w.observe(t0.Add(hopelessAfter), 404, nil); got.Fatal {
		t.Fatal("a 404 counted from before the model answered 503")
	}
	if got := w.observe(t0.Add(2*hopelessAfter), 404, nil); !got.Fatal {
		t.Fatal("a 404 held for hopelessAfter is not fatal")
	}
}

// A model that listens on a port of its own choosing is found out and
// stopped within seconds, not left to its boot timeout; the finding names the
// port it listens on.
func TestModelOnWrongPortIsStoppedWithThePortItListensOn(t *testing.T) {
	py, err := python()
	if err != nil {
		testenv.Missing(t, "python3 on PATH: %v", err)
	}
	b := testBackend(t)
	spec := shSpec("wrongport", "")
	spec.Model.Command = []string{py, "-c", `
import socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print("listening on", s.getsockname()[1], flush=True)
time.sleep(60)
`}
	start := time.Now()
	p := startModel(t, b, spec)
	waitExited(t, p)
	if took := time.Since(start); took > hopelessAfter+5*time.Second {
		t.Errorf("stopped after %v", took)
	}
	port, _ := strconv.Atoi(strings.TrimPrefix(p.LastLogLine(), "listening on "))
	want := fmt.Sprintf("no answer on 127.0.0.1:%d (the model must listen on $PORT); it listens on %d", p.port, port)
	if got := p.BootProblem(); got.Text != want || !got.Fatal {
		t.Fatalf("boot problem = %+v, want %q, fatal", got, want)
	}
	if closed(p.Ready()) {
		t.Error("ready was closed")
	}
}

func TestModelWhoseHealthPathIs404IsStopped(t *testing.T) {
	b := testBackend(t)
	spec := echoSpec(t, "nohealth")
	spec.Model.HealthPath = "/ready"
	p := startModel(t, b, spec)
	waitExited(t, p)
	if got := p.BootProblem(); got.Text != "GET /ready answered 404 (set healthPath)" || !got.Fatal {
		t.Fatalf("boot problem = %+v", got)
	}
}

func TestReadyModelHasNoBootProblem(t *testing.T) {
	b := testBackend(t)
	p := startReady(t, b, echoSpec(t, "fine"))
	if got := p.BootProblem(); got.Text != "" || got.Fatal {
		t.Fatalf("boot problem = %+v", got)
	}
}

func TestGroupListeningPortsFindsOnlyTheGroupsSockets(t *testing.T) {
	py, err := python()
	if err != nil {
		testenv.Missing(t, "python3 on PATH: %v", err)
	}
	b := testBackend(t)
	spec := shSpec("lister", "")
	// The listener is a child of the leader, as behind a shell wrapper.
	spec.Model.Command = []string{"sh", "-c", py + ` -c '
import socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print("listening on", s.getsockname()[1], flush=True)
time.sleep(60)
'`}
	b.listening = func(int) ([]int, error) { return nil, errors.New("not in this test") }
	p := startModel(t, b, spec)
	waitFor(t, "the child to listen", func() bool { return strings.HasPrefix(p.LastLogLine(), "listening on ") })
	port, _ := strconv.Atoi(strings.TrimPrefix(p.LastLogLine(), "listening on "))
	got, err := groupListeningPorts(p.pid)
	if err != nil || len(got) != 1 || got[0] != port {
		t.Fatalf("groupListeningPorts = %v, %v; want [%d]", got, err, port)
	}
	// Another group, whose process listens on nothing, reports no port, not
	// the lister's. (Not the test binary's own group: other tests in the
	// package may hold listeners open at the same time.)
	quiet := startModel(t, b, shSpec("quiet", "echo up; exec sleep 60"))
	waitFor(t, "the quiet model to start", func() bool { return quiet.LastLogLine() == "up" })
	if other, err := groupListeningPorts(quiet.pid); err != nil || len(other) != 0 {
		t.Errorf("a group that listens on nothing: groupListeningPorts = %v, %v; want none", other, err)
	}
}
