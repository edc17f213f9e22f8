package e2e

// A pending answer's fields on every route that gives one, for every kind
// of project (docs/promises.md): README "Call control" and docs/operations.md
// "Why a call waits, and how long" promise that a queued call's answer says
// where it stands (queuePosition), why it waits (waitingFor) and when it has
// likely finished (etaMs), and the status page lists the same for each
// project's queue.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// pendingKind is one kind of project, kept busy by held calls.
type pendingKind struct {
	name, project, modelKey string
	manifest                string
	held                    int                         // calls that fill its one replica
	hold                    func(release string) string // a call's inputs held until release exists
}

// TestEveryPendingAnswerSaysWhereWhyAndWhen queues three calls behind a
// project's busy replica (maxReplicas 1), for a project of one call at a
// time, of two at a time, and one that batches, and reads each on every
// route that answers a pending call: a startOnly start on /start/v4 and
// /start/v3, a sync start whose startWait runs out, a check on /check/v4
// and /check/v3, a long poll whose wait runs out, and the project's queue
// on /v1/status/projects. Each says queued, its place in the queue, that
// it waits at maxReplicas (not "about to run": the replica has no room,
// even for a batch that is not full), and an estimate that grows with the
// place.
func TestEveryPendingAnswerSaysWhereWhyAndWhen(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	until := func(release string) string { return fmt.Sprintf(`{"until":%q}`, release) }
	kinds := []pendingKind{
		{name: "one call at a time", project: "single", modelKey: "mk-single", held: 1, hold: until,
			manifest: echoProject("single", "acme", "mk-single", echo, marker(), "") + "    minReplicas: 1\n    maxReplicas: 1\n"},
		{name: "two calls at a time", project: "pair", modelKey: "mk-pair", held: 2, hold: until,
			manifest: echoProject("pair", "acme", "mk-pair", echo, marker(), "") + "    minReplicas: 1\n    maxReplicas: 1\n    concurrency: 2\n"},
		// One batch in flight, of one call of the two it may hold: the
		// replica's one slot is taken all the same.
		{name: "batching", project: "batch", modelKey: "mk-batch", held: 1,
			hold:     func(release string) string { return fmt.Sprintf(`{"hold":%q}`, release) },
			manifest: batchProject(t, "batch", "mk-batch", 1, 2, 10)},
	}
	var manifest string
	for _, k := range kinds {
		manifest += k.manifest
	}
	// startWait and longPollWait are the waits that run out here: a held
	// call never finishes within them. Room for the three minimums
	// whatever the box's cores (cpuSlots defaults to one per CPU).
	dir, cfg := newDaemonDir(t, "cpuSlots: 4\nstartWait: 1s\nlongPollWait: 1s\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + manifest)
	c := inferenceClient{t: t, base: d.base, key: key}

	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			var states []string
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("%s's replicas were %v; the daemon's lines about it:\n%s", k.project, states, d.logs.linesWith(`"project":"`+k.project+`"`, 30))
				}
			})
			eventually(t, time.Minute, k.project+"'s replica ready", func() bool {
				states = d.replicaStates(key, k.project)
				return slices.Equal(states, []string{"ready"})
			})
			// A run to estimate from: without one there is no etaMs.
			if r := c.waitResult(c.start(k.modelKey, `{}`, true)["callID"].(string)); r["message"] != "success" {
				t.Fatalf("a first call: %v", r)
			}
			release := filepath.Join(t.TempDir(), "release")
			var held []string
			for range k.held {
				held = append(held, c.start(k.modelKey, k.hold(release), true)["callID"].(string))
			}
			for _, id := range held {
				c.waitState(id, "running")
			}

			// Three calls queue behind the held ones, one through each start.
			var pending []string
			r := c.start(k.modelKey, `{"n":0}`, true)
			expectPending(t, "/start/v4 startOnly", r, 0)
			pending = append(pending, r["callID"].(string))
			r = startOn(t, d.base, "/start/v3", key, k.modelKey, `{"n":1}`, true)
			expectPending(t, "/start/v3 startOnly", r, 1)
			pending = append(pending, r["callID"].(string))
			r = c.start(k.modelKey, `{"n":2}`, false)
			expectPending(t, "/start/v4 whose startWait ran out", r, 2)
			pending = append(pending, r["callID"].(string))

			etas := make([]float64, len(pending))
			for pos, id := range pending {
				etas[pos] = expectPending(t, "/check/v4", c.check(id, false), pos)
				expectPending(t, "/check/v3", checkOn(t, d.base, "/check/v3", key, id, false), pos)
				expectPending(t, "/check/v4 long poll whose wait ran out", c.check(id, true), pos)
			}
			if !slices.IsSorted(etas) || etas[0] == etas[2] {
				t.Errorf("etaMs by place in the queue = %v; want it to grow with the place", etas)
			}

			queue := statusQueue(t, d.base, key, k.project)
			if len(queue) != len(pending) {
				t.Fatalf("/v1/status/projects lists %d queued calls of %s, want %d: %+v", len(queue), k.project, len(pending), queue)
			}
			for pos, q := range queue {
				if q.ID != pending[pos] || q.QueuePosition != pos || q.ETAMs == nil || *q.ETAMs <= 0 ||
					q.WaitingFor == nil || q.WaitingFor.Code != "maxReplicas" || q.WaitingFor.Text == "" {
					t.Errorf("/v1/status/projects queue entry %d = %+v; want call %s at %d, an etaMs and waitingFor maxReplicas", pos, q, pending[pos], pos)
				}
			}

			if err := os.WriteFile(release, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, id := range append(held, pending...) {
				if r := c.waitResult(id); r["message"] != "success" {
					t.Errorf("call %s once released: %v", id, r)
				}
			}
		})
	}
}

// expectPending checks a pending answer: queued, at pos, waiting at
// maxReplicas with a text, and an etaMs above 0, which it returns.
func expectPending(t *testing.T, route string, r map[string]any, pos int) float64 {
	t.Helper()
	w, _ := r["waitingFor"].(map[string]any)
	eta, _ := r["etaMs"].(float64)
	if r["message"] != "queued" || r["finished"] == true || r["queuePosition"] != float64(pos) ||
		w == nil || w["code"] != "maxReplicas" || w["text"] == "" || eta <= 0 {
		t.Errorf("%s: %v; want queued at queuePosition %d, waitingFor maxReplicas with a text, and an etaMs", route, r, pos)
	}
	return eta
}

// startOn starts a call on a start route of the Banana API (/start/v3 or
// /start/v4) and returns the answer.
func startOn(t *testing.T, base, route, key, modelKey, inputs string, startOnly bool) map[string]any {
	t.Helper()
	status, r := do(t, "POST", base+route, nil,
		fmt.Sprintf(`{"apiKey":%q,"modelKey":%q,"startOnly":%t,"modelInputs":%s}`, key, modelKey, startOnly, inputs))
	if status != http.StatusOK {
		t.Fatalf("%s answered HTTP %d: %v", route, status, r)
	}
	checkEnvelope(t, r)
	return r
}

// checkOn checks a call on a check route (/check/v3 or /check/v4).
func checkOn(t *testing.T, base, route, key, callID string, longPoll bool) map[string]any {
	t.Helper()
	status, r := do(t, "POST", base+route, nil, fmt.Sprintf(`{"apiKey":%q,"callID":%q,"longPoll":%t}`, key, callID, longPoll))
	if status != http.StatusOK {
		t.Fatalf("%s answered HTTP %d: %v", route, status, r)
	}
	checkEnvelope(t, r)
	return r
}

// statusQueued is one entry of a project's queue on /v1/status/projects.
type statusQueued struct {
	ID            string `json:"id"`
	QueuePosition int    `json:"queuePosition"`
	ETAMs         *int64 `json:"etaMs"`
	WaitingFor    *struct {
		Code string `json:"code"`
		Text string `json:"text"`
	} `json:"waitingFor"`
}

// statusQueue reads project's queue as /v1/status/projects lists it.
func statusQueue(t *testing.T, base, key, project string) []statusQueued {
	t.Helper()
	status, body := doRaw(t, "GET", base+"/v1/status/projects", map[string]string{"X-Service-API-Key": key}, "")
	var all struct {
		Results []struct {
			ID    string         `json:"id"`
			Queue []statusQueued `json:"queue"`
		} `json:"results"`
	}
	if err := json.Unmarshal(body, &all); status != http.StatusOK || err != nil {
		t.Fatalf("/v1/status/projects: HTTP %d %v %s", status, err, body)
	}
	for _, p := range all.Results {
		if p.ID == project {
			return p.Queue
		}
	}
	t.Fatalf("/v1/status/projects lists no project %s: %s", project, body)
	return nil
}
