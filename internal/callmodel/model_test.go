package callmodel

import (
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// op is one operation on call "c" from client, between call and ret
// (seconds), answering message (outputs for a success).
func op(client int, kind string, call, ret int64, status int, message, outputs string) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: Input{Kind: kind, Call: "c", Node: "node-1"},
		Output: Output{Status: status, Message: message, Outputs: outputs}, Call: call * 1e9, Return: ret * 1e9}
}

func TestHistoriesOfOneCallAgainstTheModel(t *testing.T) {
	start := op(0, OpStart, 0, 1, 200, "queued", "")
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"pending, then one final answer everywhere", []porcupine.Operation{start,
			op(1, OpCheck, 2, 3, 200, "running", ""), op(1, OpCheck, 4, 5, 200, "success", `[{"x":1}]`),
			op(2, OpCheck, 6, 7, 200, "success", `[{"x":1}]`)}, true},
		{"queued again after running (a lost node's call run again)", []porcupine.Operation{start,
			op(1, OpCheck, 2, 3, 200, "running", ""), op(1, OpCheck, 4, 5, 200, "queued", "")}, true},
		{"pending after final", []porcupine.Operation{start,
			op(1, OpCheck, 2, 3, 200, "success", `[1]`), op(2, OpCheck, 4, 5, 200, "running", "")}, false},
		{"a pending check overlapping the final one", []porcupine.Operation{start,
			op(1, OpCheck, 2, 6, 200, "running", ""), op(2, OpCheck, 3, 4, 200, "success", `[1]`)}, true},
		{"two final answers: a node's own failure over a committed success", []porcupine.Operation{start,
			op(1, OpCheck, 2, 3, 200, "success", `[1]`),
			op(2, OpCheck, 4, 5, 200, "error: cluster unavailable: the result could not be saved; start the call again", "")}, false},
		{"the same message, other outputs", []porcupine.Operation{start,
			op(1, OpCheck, 2, 3, 200, "success", `[1]`), op(2, OpCheck, 4, 5, 200, "success", `[2]`)}, false},
		{"a callID handed out, not found", []porcupine.Operation{start,
			op(1, OpCheck, 2, 3, 200, "error: callID not found", "")}, false},
		{"503s and lost answers say nothing", []porcupine.Operation{start,
			op(1, OpCheck, 2, 3, 503, "error: cluster unavailable; retry", ""),
			{ClientId: 2, Input: Input{Kind: OpCheck, Call: "c"}, Output: Output{Err: "timeout"}, Call: 4e9, Return: 5e9},
			op(1, OpCheck, 6, 7, 200, "success", `[1]`)}, true},
		{"a cancel that took effect, then checks", []porcupine.Operation{start,
			op(1, OpCancel, 2, 3, 200, "success", ""), op(2, OpCheck, 4, 5, 200, Cancelled, "")}, true},
		{"a cancel that took effect, then success", []porcupine.Operation{start,
			op(1, OpCancel, 2, 3, 200, "success", ""), op(2, OpCheck, 4, 5, 200, "success", `[1]`)}, false},
		{"a cancel of a finished call", []porcupine.Operation{start,
			op(1, OpCheck, 2, 3, 200, "success", `[1]`),
			op(2, OpCancel, 4, 5, 200, "error: call already finished (succeeded)", "")}, true},
		{"a cancel that finds it finished before a check did", []porcupine.Operation{start,
			op(2, OpCancel, 2, 3, 200, "error: call already finished (succeeded)", ""),
			op(1, OpCheck, 4, 5, 200, "success", `[1]`), op(1, OpCheck, 6, 7, 200, "success", `[1]`)}, true},
		{"pending after a cancel found it finished", []porcupine.Operation{start,
			op(2, OpCancel, 2, 3, 200, "error: call already finished (succeeded)", ""),
			op(1, OpCheck, 4, 5, 200, "running", "")}, false},
		{"failed after a cancel found it succeeded", []porcupine.Operation{start,
			op(2, OpCancel, 2, 3, 200, "error: call already finished (succeeded)", ""),
			op(1, OpCheck, 4, 5, 200, "error: model failed", "")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, report := Check(tc.ops, 10*time.Second)
			if ok != tc.ok {
				t.Errorf("Check = %v; want %v\n%s", ok, tc.ok, report)
			}
			if !ok && !strings.Contains(report, "call c is not linearizable") {
				t.Errorf("the report does not print the call's history:\n%s", report)
			}
		})
	}
}

// Calls are checked apart: a violation on one is reported with its own
// operations, not the other's.
func TestCheckReportsOnlyTheCallThatIsNotLinearizable(t *testing.T) {
	good := op(0, OpStart, 0, 1, 200, "queued", "")
	bad := []porcupine.Operation{op(0, OpStart, 0, 1, 200, "queued", ""),
		op(1, OpCheck, 2, 3, 200, "success", `[1]`), op(1, OpCheck, 4, 5, 200, "queued", "")}
	for i := range bad {
		in := bad[i].Input.(Input)
		in.Call = "d"
		bad[i].Input = in
	}
	ok, report := Check(append([]porcupine.Operation{good}, bad...), 10*time.Second)
	if ok || !strings.Contains(report, "call d is not linearizable") || strings.Contains(report, "call c ") {
		t.Errorf("Check = %v:\n%s", ok, report)
	}
}
