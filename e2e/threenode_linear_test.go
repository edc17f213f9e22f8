//go:build cluster

package e2e

// The linearizability check (#42): clients start, check and cancel calls
// through all three nodes while nodes are killed, cut off and stopped;
// every operation is recorded with its answer and times, and the history
// is checked against the model of a call's states (internal/callmodel)
// with porcupine. A violation prints the history of the call concerned.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"inferd/internal/callmodel"
)

// opTimeout bounds one recorded operation: a node stopped (SIGSTOP) or
// cut off answers nothing, and that operation's outcome is unknown.
const opTimeout = 10 * time.Second

// recorder is the history of the clients' operations.
type recorder struct {
	mu    sync.Mutex
	ops   []porcupine.Operation
	calls []string // the callIDs handed out
	http  *http.Client
	key   string
}

// do sends one operation to node n and records it; a start is recorded
// under the callID it was given (none given: nothing to record).
func (h *recorder) do(client int, n *clusterNode, kind, path, body, call string) callmodel.Output {
	began := time.Now()
	out := h.send(n.base+path, body)
	ended := time.Now()
	in := callmodel.Input{Kind: kind, Call: call, Node: n.name}
	if kind == callmodel.OpStart {
		in.Call = out.callID
		if in.Call == "" {
			return out.Output
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Output: out.Output,
		Call: began.UnixNano(), Return: ended.UnixNano()})
	if kind == callmodel.OpStart {
		h.calls = append(h.calls, in.Call)
	}
	return out.Output
}

type sent struct {
	callmodel.Output
	callID string
}

func (h *recorder) send(url, body string) sent {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return sent{Output: callmodel.Output{Err: err.Error()}}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.http.Do(req)
	if err != nil {
		return sent{Output: callmodel.Output{Err: err.Error()}}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return sent{Output: callmodel.Output{Status: resp.StatusCode, Err: err.Error()}}
	}
	var r struct {
		Message      string          `json:"message"`
		CallID       string          `json:"callID"`
		ModelOutputs json.RawMessage `json:"modelOutputs"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return sent{Output: callmodel.Output{Status: resp.StatusCode, Err: fmt.Sprintf("answer %q: %v", raw, err)}}
	}
	out := callmodel.Output{Status: resp.StatusCode, Message: r.Message}
	if r.Message == "success" {
		out.Outputs = string(r.ModelOutputs)
	}
	return sent{Output: out, callID: r.CallID}
}

func (h *recorder) start(client int, n *clusterNode, inputs string) {
	h.do(client, n, callmodel.OpStart, "/start/v4",
		fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-lin","startOnly":true,"modelInputs":%s}`, h.key, inputs), "")
}

func (h *recorder) check(client int, n *clusterNode, id string, longPoll bool) callmodel.Output {
	return h.do(client, n, callmodel.OpCheck, "/check/v4/",
		fmt.Sprintf(`{"apiKey":%q,"callID":%q,"longPoll":%t}`, h.key, id, longPoll), id)
}

func (h *recorder) cancel(client int, n *clusterNode, id string) {
	h.do(client, n, callmodel.OpCancel, "/cancel/v4", fmt.Sprintf(`{"apiKey":%q,"callID":%q}`, h.key, id), id)
}

// someCall is one of the callIDs handed out, at random; "" before any.
func (h *recorder) someCall(r *rand.Rand) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.calls) == 0 {
		return ""
	}
	return h.calls[r.IntN(len(h.calls))]
}

func (h *recorder) count() (ops, calls int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops), len(h.calls)
}

// Issue 42, "Done when" 5: four clients start (startOnly), check and now
// and then cancel calls of a retrying project through random nodes, while
// a node is killed (kill -9) and started again, a node is cut off from the
// other two (network namespaces) and healed, and a node is stopped
// (SIGSTOP) past its lease and continued. Then every call is long-polled
// to its end and checked through every node. The whole history, every
// operation with its answer and its times, must be linearizable against
// the model of a call's states (internal/callmodel); a violation prints
// the history of each call concerned.
func TestThreeNodeClusterHistoryIsLinearizable(t *testing.T) {
	echo := echoDir(t)
	mark := marker()
	c := newThreeNodes(t, clusterOpts{isolated: true})
	n1 := c.nodes[0]
	admin := n1.d.createKey("acme", true)
	h := &recorder{key: n1.d.createKey("acme", false), http: &http.Client{}}
	n1.d.apply("projects:\n" + echoProject("lin", "acme", "mk-lin", echo, mark, "") +
		"    minReplicas: 3\n    maxReplicas: 3\n    concurrency: 2\n    retries: 1\n")
	leader := c.waitLeader(t, admin, time.Minute, c.nodes[:])
	c.waitReplicas(t, admin, mark, "lin", 2*time.Minute, c.nodes[:], "a replica on each node", func(m map[string]int) bool {
		return m["node-1"] == 1 && m["node-2"] == 1 && m["node-3"] == 1
	})

	stop := make(chan struct{})
	var clients sync.WaitGroup
	for client := range 4 {
		clients.Go(func() {
			r := rand.New(rand.NewPCG(uint64(client), uint64(time.Now().UnixNano())))
			// The clients' pace: about 50 operations a second in all, load
			// on a shared 2-core box beside three nodes (not a wait for
			// anything).
			pace := time.NewTicker(80 * time.Millisecond)
			defer pace.Stop()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				case <-pace.C:
				}
				n := c.nodes[r.IntN(3)]
				id := h.someCall(r)
				switch p := r.Float64(); {
				case id == "" || p < 0.3:
					h.start(client, n, fmt.Sprintf(`{"tag":"lin-%d-%d","sleep":%.2f}`, client, seq, 0.2+r.Float64()*1.3))
				case p < 0.37:
					h.cancel(client, n, id)
				default:
					h.check(client, n, id, false)
				}
			}
		})
	}
	t.Cleanup(func() { // a test that fails early stops its clients too
		select {
		case <-stop:
		default:
			close(stop)
		}
		clients.Wait()
	})
	loadFor := func(calls int) {
		eventually(t, 2*time.Minute, fmt.Sprintf("%d more calls started", calls), func() bool {
			_, n := h.count()
			return n >= calls
		})
	}
	dropped := func(victim *clusterNode) {
		eventually(t, time.Minute, "the others no longer list "+victim.name, func() bool {
			for _, n := range c.others(victim.name) {
				if v, ok := n.view(admin); !ok || contains(v.names(), victim.name) {
					return false
				}
			}
			return true
		})
	}
	listed := func() {
		eventually(t, 2*time.Minute, "every node listing all three", func() bool {
			for _, n := range c.nodes {
				if v, ok := n.view(admin); !ok || len(v.names()) != 3 {
					return false
				}
			}
			return true
		})
	}
	_, began := h.count()
	loadFor(began + 10)

	// kill -9 of a node that does not lead, and its return.
	killed := c.others(leader)[0]
	killed.d.kill()
	t.Logf("killed %s", killed.name)
	dropped(killed)
	killed.launch(t)
	killed.waitServing(t)
	listed()
	_, n := h.count()
	loadFor(n + 10)

	// A node cut off from the other two, past its lease, and healed.
	cut := c.others(killed.name)[0]
	cut.cut(t)
	t.Logf("cut %s off", cut.name)
	dropped(cut)
	cut.heal(t)
	listed()
	_, n = h.count()
	loadFor(n + 10)

	// A node stopped past its lease (a long GC pause, a frozen VM), and
	// continued.
	frozen := c.others(cut.name, killed.name)[0]
	if err := frozen.d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped %s", frozen.name)
	dropped(frozen)
	if err := frozen.d.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	listed()
	_, n = h.count()
	loadFor(n + 10)
	close(stop)
	clients.Wait()

	// Every call to its end, then checked through every node: all of it
	// is in the history.
	h.mu.Lock()
	calls := append([]string(nil), h.calls...)
	h.mu.Unlock()
	deadline := time.Now().Add(3 * time.Minute)
	for i, id := range calls {
		for {
			out := h.check(0, c.nodes[i%3], id, true)
			if out.Status == http.StatusOK && out.Message != "queued" && out.Message != "booting" && out.Message != "running" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("call %s still %q %s", id, out.Message, out.Err)
				break
			}
		}
		for _, n := range c.nodes {
			h.check(1, n, id, false)
		}
	}

	ops, _ := h.count()
	t.Logf("%d operations on %d calls through kill -9, a cut and SIGSTOP", ops, len(calls))
	ok, report := callmodel.Check(h.ops, time.Minute)
	if !ok {
		t.Fatalf("the history is not linearizable against the model of a call:\n%s", report)
	}
}
