package local

import (
	"testing"
	"time"
)

// On the host's network (replica.network: host, or inferd not root) each replica
// listens on a loopback port of its own. The kernel may offer a port that another replica was given but has not bound
// yet, or still holds: a second replica must then get another port, or its health
// check and its calls would reach the first replica's model (another project's,
// possibly another team's).
func TestReplicaNeverGetsThePortOfALiveReplica(t *testing.T) {
	be := testBackendWith(t, hostNetwork)
	a := startReady(t, be, echoSpec(t, "port-a"))

	offered := false
	be.ports.listen = func() (int, error) {
		if !offered { // the kernel repeats a's port once
			offered = true
			return a.port, nil
		}
		return listenPort()
	}
	b := startReady(t, be, echoSpec(t, "port-b"))
	if b.port == a.port {
		t.Fatalf("replica b was given port %d, which replica a holds", b.port)
	}
	if r := infer(t, b, `{}`); r.Replica != "port-b" {
		t.Errorf("a call to replica b was answered by replica %q", r.Replica)
	}
}

// A port comes free again once its replica has exited, or when its replica failed
// to start.
func TestPortIsGivenBackWhenTheReplicaEnds(t *testing.T) {
	be := testBackendWith(t, hostNetwork)
	port, err := listenPort()
	if err != nil {
		t.Fatal(err)
	}
	be.ports.listen = func() (int, error) { return port, nil } // the kernel offers only this one

	spec := shSpec("gone-1", "exec sleep 60")
	spec.Model.Command = []string{"/nonexistent/model"}
	if _, err := be.start(spec); err == nil {
		t.Fatal("start of a missing program succeeded")
	}
	a := startModel(t, be, shSpec("port-1", "exec sleep 60"))
	if a.port != port {
		t.Fatalf("port %d still held after a failed start", port)
	}
	if _, err := be.start(shSpec("port-2", "exec sleep 60")); err == nil {
		t.Fatal("a second replica started on a port that a live replica holds")
	}
	a.stop(time.Second)
	b := startModel(t, be, shSpec("port-3", "exec sleep 60"))
	if b.port != port {
		t.Fatalf("port %d still held after its replica exited", port)
	}
}
