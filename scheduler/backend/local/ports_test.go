package replica

import (
	"testing"
	"time"
)

// The kernel may offer a port that another replica was given but has not bound
// yet, or still holds: a second replica must then get another port, or its health
// check and its calls would reach the first replica's model (another project's,
// possibly another team's).
func TestReplicaNeverGetsThePortOfALiveReplica(t *testing.T) {
	a := startReady(t, echoSpec(t, "port-a"))

	saved := listenPort
	t.Cleanup(func() { listenPort = saved })
	offered := false
	listenPort = func() (int, error) {
		if !offered { // the kernel repeats a's port once
			offered = true
			return a.Port(), nil
		}
		return saved()
	}
	b := startReady(t, echoSpec(t, "port-b"))
	if b.Port() == a.Port() {
		t.Fatalf("replica b was given port %d, which replica a holds", b.Port())
	}
	if r := infer(t, b, `{}`); r.Replica != "port-b" {
		t.Errorf("a call to replica b was answered by replica %q", r.Replica)
	}
}

// A port comes free again once its replica has exited, or when its replica failed
// to start.
func TestPortIsGivenBackWhenTheReplicaEnds(t *testing.T) {
	saved := listenPort
	t.Cleanup(func() { listenPort = saved })
	port, err := saved()
	if err != nil {
		t.Fatal(err)
	}
	listenPort = func() (int, error) { return port, nil } // the kernel offers only this one

	spec := shSpec(t, "gone-1", "exec sleep 60")
	spec.Command = []string{"/nonexistent/model"}
	if _, err := Start(spec, testLogger(t)); err == nil {
		t.Fatal("Start of a missing program succeeded")
	}
	a := startModel(t, shSpec(t, "port-1", "exec sleep 60"))
	if a.Port() != port {
		t.Fatalf("port %d still held after a failed start", port)
	}
	if _, err := Start(shSpec(t, "port-2", "exec sleep 60"), testLogger(t)); err == nil {
		t.Fatal("a second replica started on a port that a live replica holds")
	}
	a.Stop(time.Second)
	b := startModel(t, shSpec(t, "port-3", "exec sleep 60"))
	if b.Port() != port {
		t.Fatalf("port %d still held after its replica exited", port)
	}
}
