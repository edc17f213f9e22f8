package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"inferd/scheduler"
)

// TestStartRefusesInputsEveryDoorRefuses: whatever door a request came by
// (a body as read, inputs only, or a body that is the inputs), text that
// is not UTF-8 and inputs nested past MaxInputDepth are refused before the
// key is read or a call exists, with a text that names the offset or the
// bound; the same request, well-formed, starts.
func TestStartRefusesInputsEveryDoorRefuses(t *testing.T) {
	deep := strings.Repeat("[", 5) + strings.Repeat("]", 5)
	for _, tc := range []struct {
		name   string
		body   []byte
		inputs json.RawMessage
		want   string // "" = started
	}{
		{"a body with a byte that is not UTF-8", []byte("{\"model\":\"a\",\"prompt\":\"\xff\"}"), nil, "request body is not valid UTF-8 at byte 23"},
		{"inputs with one, no body", nil, json.RawMessage("{\"x\":\"ok\xc3\"}"), "request body is not valid UTF-8 at byte 8"},
		{"a body that is the inputs, nested too deep", []byte(`{"x":` + deep + `}`), nil, "the request's inputs nest deeper than 4 levels"},
		{"inputs nested too deep, in a body that is not", []byte(`{"modelInputs":{"x":` + deep + `}}`), json.RawMessage(`{"x":` + deep + `}`), "the request's inputs nest deeper than 4 levels"},
		{"a brace inside a string is not nesting", []byte(`{"x":"[[[[[[["}`), nil, ""},
		{"well-formed", []byte(`{"x":[[["é"]]]}`), nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{MaxInputDepth: 4})
			out, ref := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ProjectID: "h"},
				Body: tc.body, Call: scheduler.Request{Inputs: tc.inputs}})
			if tc.want == "" {
				if ref != nil || out.Call.ID == "" {
					t.Fatalf("refused %v", ref)
				}
				return
			}
			var ie *InputError
			if ref == nil || ref.Kind != RefusedInput || !errors.As(ref.Err, &ie) || ref.Err.Error() != tc.want {
				t.Fatalf("refusal %v; want RefusedInput %q", ref, tc.want)
			}
			if len(e.st.reads) != 0 || len(e.sched.starts) != 0 {
				t.Errorf("read %v and started %d before refusing", e.st.reads, len(e.sched.starts))
			}
		})
	}
}
