package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// Issue 22, "Done when" 1: in a cluster of three nodes, each running one
// member of the embedded etcd, every node sees the three and one leader;
// keys and projects created through node 1 work
// on nodes 2 and 3; a call started on node 2 is answered by a check on
// node 3, and a long poll on a node other than the one running the call is
// woken when the call finishes there (an etcd watch), not at the end of its
// wait.
func TestThreeNodeClusterSharesKeysProjectsAndCalls(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	mark := marker()
	c := newThreeNodes(t, clusterOpts{})
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	admin := n1.d.createKey("acme", true)
	key := n1.d.createKey("acme", false)
	n1.d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, mark, "") + "    maxReplicas: 3\n")

	t.Run("every node's status shows the three nodes and one leader", func(t *testing.T) {
		c.waitLeader(t, admin, time.Minute, c.nodes[:])
		for _, n := range c.nodes {
			if v, _ := n.view(admin); !slices.Equal(v.names(), []string{"node-1", "node-2", "node-3"}) {
				t.Errorf("%s's cluster view lists %v", n.name, v.names())
			}
		}
	})

	t.Run("keys and projects made through node 1 work on nodes 2 and 3", func(t *testing.T) {
		for _, n := range []*clusterNode{n2, n3} {
			if s, _ := doRaw(t, "GET", n.base+"/v1/projects/echo", map[string]string{"X-Service-API-Key": admin}, ""); s != http.StatusOK {
				t.Errorf("node 1's admin key and project on %s: HTTP %d", n.name, s)
			}
			r := n.client(t, key).start("mk-echo", `{"env":"E2E_NODE"}`, false)
			if r["message"] != "success" {
				t.Errorf("a call through %s: %v", n.name, r)
			}
		}
	})

	t.Run("inferd call through any node runs the call where its project is placed", func(t *testing.T) {
		for _, n := range c.nodes {
			out, err := n.d.cli("call", "echo", `{"prompt":"hi"}`)
			if err != nil || !strings.Contains(out, `"echo":{"prompt":"hi"}`) {
				t.Errorf("inferd call through %s: %q, %v", n.name, out, err)
			}
		}
	})

	t.Run("a call started on node 2 is answered by a check on node 3", func(t *testing.T) {
		r := n2.client(t, key).start("mk-echo", c.logged("check-on-3", ""), false)
		if r["message"] != "success" {
			t.Fatalf("start on node 2: %v", r)
		}
		got := n3.client(t, key).check(r["callID"].(string), false)
		if got["message"] != "success" || output(t, got)["echo"].(map[string]any)["tag"] != "check-on-3" {
			t.Fatalf("check on node 3 = %v", got)
		}
	})

	t.Run("an admin cancel through one node ends a call running on another", func(t *testing.T) {
		r := n1.client(t, key).start("mk-echo", c.logged("cancel-elsewhere", `"sleep":60`), true)
		id, _ := r["callID"].(string)
		if id == "" {
			t.Fatalf("start on node 1: %v", r)
		}
		ranOn := c.waitRun(t, "cancel-elsewhere", time.Minute)
		via := c.others(ranOn)[0]
		if out, err := via.d.cli("call", "cancel", id); err != nil || !strings.Contains(out, "Cancelled call "+id) {
			t.Fatalf("inferd call cancel through %s of a call running on %s: %q, %v", via.name, ranOn, out, err)
		}
		if got := via.client(t, key).check(id, false); got["message"] != "error: cancelled by request" {
			t.Errorf("the call after its cancel through %s: %v", via.name, got)
		}
	})

	t.Run("a long poll is woken by the call finishing on another node", func(t *testing.T) {
		// The model sleeps 3 s; longPollWait is 30 s (both stretched on a
		// busy machine, as the bound below is). A long poll not woken by
		// the completion would answer at the end of its wait.
		r := n2.client(t, key).start("mk-echo", c.logged("long-poll", fmt.Sprintf(`"sleep":%.1f`, testenv.Scale(3*time.Second).Seconds())), true)
		id, _ := r["callID"].(string)
		if id == "" {
			t.Fatalf("start on node 2: %v", r)
		}
		ranOn := c.waitRun(t, "long-poll", time.Minute)
		pollers := c.others(ranOn)
		if len(pollers) != 2 {
			t.Fatalf("the call ran on %q, not a node of the cluster", ranOn)
		}
		if now := pollers[0].client(t, key).check(id, false); now["message"] == "success" {
			t.Fatalf("the call was over before the long polls began: %v", now)
		}
		var wg sync.WaitGroup
		for _, n := range pollers {
			wg.Go(func() {
				began := time.Now()
				status, got, err := tryDo("POST", n.base+"/check/v4/", nil, `{"apiKey":"`+key+`","callID":"`+id+`","longPoll":true}`)
				took := time.Since(began)
				switch {
				case err != nil || status != http.StatusOK:
					t.Errorf("long poll on %s: HTTP %d %v %v", n.name, status, got, err)
				case got["message"] != "success":
					t.Errorf("long poll on %s (the call ran on %s) answered %v after %s, want success", n.name, ranOn, got, took)
				case took > testenv.Scale(10*time.Second):
					t.Errorf("long poll on %s took %s for a %s call: not woken by the completion on %s [%s]",
						n.name, took, testenv.Scale(3*time.Second), ranOn, testenv.Load())
				}
			})
		}
		wg.Wait()
	})
}
