package local

import (
	"os"
	"strings"
	"testing"

	"inferd/scheduler/backend"
	"inferd/store"
)

// TestDocsListTheWholeModelEnvironment: README.md and docs/protocols.md
// name every variable a replica can get: the allowlist from inferd's own
// environment, replica.passEnv's default, what inferd sets, so that a model
// author does not find one by surprise.
func TestDocsListTheWholeModelEnvironment(t *testing.T) {
	getenv := func(string) (string, bool) { return "x", true } // inferd has them all
	spec := backend.Spec{ReplicaID: "r-1", ProjectID: "p", TeamID: "t", Model: store.ModelSpec{Command: []string{"m"}}}
	vars := environ(spec, nil, 8000, nil, "/home", []string{"LD_LIBRARY_PATH"}, getenv)
	for _, doc := range []string{"../../../README.md", "../../../docs/protocols.md"} {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range vars {
			name, _, _ := strings.Cut(kv, "=")
			if !strings.Contains(string(text), "`"+name+"`") {
				t.Errorf("%s does not name %s, which a model may get", doc, name)
			}
		}
	}
}
