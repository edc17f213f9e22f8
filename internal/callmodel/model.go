// Package callmodel is the sequential model of one inference call, as the
// Banana API shows it to clients, for checking a recorded history of
// starts, checks and cancels against it with porcupine (linearizability:
// make test-cluster's TestThreeNodeClusterHistoryIsLinearizable).
//
// What a client may see of a call, whichever node it asks, is what one
// call going through these states in some order consistent with real time
// would answer:
//
//   - a start creates the call: pending (queued, booting, running), or
//     already final;
//   - while pending a check answers pending (the state within pending may
//     go back and forth: a call run again after its node was lost is
//     queued again), or the call becomes final with that answer;
//   - once final, every check answers that same final answer (message and
//     outputs): one answer per call, on every node, after any fault;
//   - a cancel that answers "success" made a pending call final as
//     `error: cancelled by request`; one that answers "call already
//     finished (succeeded)" or "(failed…)" found it final so;
//   - a call whose callID was handed out is never "not found".
//
// An answer that says nothing of the call (a 503 `cluster unavailable;
// retry`, a rate limit, a request that got no answer) constrains nothing:
// the operation may have happened or not.
package callmodel

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kinds of operation.
const (
	OpStart  = "start"
	OpCheck  = "check"
	OpCancel = "cancel"
)

// Input is an operation as the client sent it: its kind, the call it is
// about (for a start, the callID it was given) and the node it went to.
type Input struct {
	Kind string
	Call string
	Node string
}

// Output is what the client got: the HTTP status (0 when no answer came),
// the answer's message and its modelOutputs (JSON, "" when none), or the
// error of a request that got no answer.
type Output struct {
	Status  int
	Message string
	Outputs string
	Err     string
}

// Cancelled is a cancelled call's final message.
const Cancelled = "error: cancelled by request"

// state is a call as the model holds it.
type state struct {
	created bool
	final   bool
	success bool   // final: it succeeded
	answer  string // final: the answer, message and outputs; "" while only a cancel has seen it final
}

// finalAs is s final with answer a (a check's, or a cancel's: "" when
// only whether it succeeded is known).
func finalAs(success bool, a string) state {
	return state{created: true, final: true, success: success, answer: a}
}

// answer is out's final answer as compared between checks.
func answer(out Output) string { return out.Message + " " + out.Outputs }

// class is what an answer says of the call.
type class int

const (
	unknown        class = iota // nothing: the operation may or may not have happened
	pending                     // queued, booting or running
	final                       // success or an error that ends the call
	notFound                    // error: callID not found
	cancelOK                    // a cancel that took effect
	finishedOK                  // a cancel of a call that was final: succeeded
	finishedFailed              // a cancel of a call that was final: failed
)

func classify(in Input, out Output) class {
	msg := out.Message
	switch {
	case out.Status != 200 || out.Err != "":
		return unknown // a 503, or no answer at all
	case msg == "error: callID not found":
		return notFound
	case strings.HasPrefix(msg, "error: cluster unavailable; retry"), strings.HasPrefix(msg, "error: rate limit"),
		strings.HasPrefix(msg, "error: the server is shutting down"):
		return unknown
	case in.Kind == OpCancel && msg == "success":
		return cancelOK
	case in.Kind == OpCancel && strings.Contains(msg, "call already finished (succeeded)"):
		return finishedOK
	case in.Kind == OpCancel && strings.Contains(msg, "call already finished"):
		return finishedFailed
	case in.Kind == OpCancel:
		return unknown // another refusal: nothing changed
	case msg == "queued" || msg == "booting" || msg == "running":
		return pending
	}
	return final // "success", or "error: …" ending the call
}

// step is the model's step: whether a call in state s can answer in with
// out, and its state after.
func step(s state, in Input, out Output) (bool, state) {
	c := classify(in, out)
	success := out.Message == "success"
	if in.Kind == OpStart {
		switch {
		case c == unknown:
			return true, s
		case s.created:
			return false, s // one call per callID
		case c == final:
			return true, finalAs(success, answer(out))
		}
		return true, state{created: true}
	}
	switch c {
	case unknown:
		return true, s
	case notFound:
		return false, s // a callID handed out is never lost
	case pending:
		return !s.final, s
	case final:
		switch {
		case !s.final:
			return true, finalAs(success, answer(out))
		case s.answer == "": // a cancel saw it final: this check says with what
			return s.success == success, finalAs(success, answer(out))
		}
		return s.answer == answer(out), s
	case cancelOK:
		if s.final {
			return false, s
		}
		return true, finalAs(false, Cancelled+" ")
	case finishedOK, finishedFailed:
		ok := c == finishedOK
		if !s.final {
			return true, finalAs(ok, "") // the cancel is where it was seen final
		}
		return s.success == ok, s
	}
	return false, s
}

// Model is the porcupine model of calls: one partition per call.
func Model() porcupine.Model {
	return porcupine.Model{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byCall := map[string][]porcupine.Operation{}
			var ids []string
			for _, op := range history {
				id := op.Input.(Input).Call
				if _, ok := byCall[id]; !ok {
					ids = append(ids, id)
				}
				byCall[id] = append(byCall[id], op)
			}
			sort.Strings(ids)
			out := make([][]porcupine.Operation, 0, len(ids))
			for _, id := range ids {
				out = append(out, byCall[id])
			}
			return out
		},
		Init: func() any { return state{} },
		Step: func(s, in, out any) (bool, any) {
			return step(s.(state), in.(Input), out.(Output))
		},
		DescribeOperation: func(in, out any) string { return describe(in.(Input), out.(Output)) },
		DescribeState: func(s any) string {
			st := s.(state)
			switch {
			case !st.created:
				return "absent"
			case !st.final:
				return "pending"
			case st.answer == "":
				return fmt.Sprintf("final (succeeded: %v)", st.success)
			}
			return "final: " + st.answer
		},
	}
}

func describe(in Input, out Output) string {
	got := fmt.Sprintf("HTTP %d %q %s", out.Status, out.Message, out.Outputs)
	if out.Err != "" {
		got = "no answer: " + out.Err
	}
	return fmt.Sprintf("%s %s via %s -> %s", in.Kind, in.Call, in.Node, got)
}

// Check checks history against the model within timeout. It reports
// whether the history is linearizable (an Unknown result, the check out
// of time, is not) and, when it is not, the operations of each call that
// could not be linearized, in the order they began, with their times
// relative to the first operation.
func Check(history []porcupine.Operation, timeout time.Duration) (bool, string) {
	m := Model()
	res, info := porcupine.CheckOperationsVerbose(m, history, timeout)
	if res == porcupine.Ok {
		return true, ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "porcupine: %s\n", res)
	if len(history) == 0 {
		return false, b.String()
	}
	t0 := history[0].Call
	for _, op := range history {
		t0 = min(t0, op.Call)
	}
	partitions := m.Partition(history)
	for _, p := range partitions {
		if ok, _ := checkOne(m, p, timeout); ok {
			continue
		}
		sort.Slice(p, func(i, j int) bool { return p[i].Call < p[j].Call })
		fmt.Fprintf(&b, "call %s is not linearizable:\n", p[0].Input.(Input).Call)
		for _, op := range p {
			fmt.Fprintf(&b, "  client %d  %8.3fs .. %8.3fs  %s\n", op.ClientId,
				float64(op.Call-t0)/1e9, float64(op.Return-t0)/1e9, describe(op.Input.(Input), op.Output.(Output)))
		}
	}
	_ = info // the visualization's data; the text above is what a test log can hold
	return false, b.String()
}

// checkOne checks one call's operations alone.
func checkOne(m porcupine.Model, ops []porcupine.Operation, timeout time.Duration) (bool, porcupine.CheckResult) {
	one := m
	one.Partition = nil
	res := porcupine.CheckOperationsTimeout(one, ops, timeout)
	return res == porcupine.Ok, res
}
