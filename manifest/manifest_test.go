package manifest

import (
	"path/filepath"
	"strings"
	"testing"

	"inferd/store"
)

const echoManifest = `
projects:
  - id: echo
    team: acme
    modelKey: mk-echo-1
    command: ["python3", "server.py"]
    dir: ./examples/echo
    env: {GREETING: "hi"}
    protocol: http
    gpus: 0
    concurrency: 1
    bootTimeout: 600
    minReplicas: 0
    maxReplicas: 3
    inferenceTimeout: 300
    idleTimeout: 30
    retries: 2
`

func TestParseFullEntry(t *testing.T) {
	ps, err := Parse([]byte(echoManifest), "/srv/models")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Fatalf("got %d projects", len(ps))
	}
	p := ps[0]
	if p.ID != "echo" || p.TeamID != "acme" || p.MaxReplicas != 3 || p.IdleTimeout != 30 || p.InferenceTimeout != 300 || p.Retries != 2 {
		t.Fatalf("project fields: %+v", p)
	}
	if p.Model.Dir != "/srv/models/examples/echo" || p.Model.Env["GREETING"] != "hi" || p.Model.Protocol != "http" {
		t.Fatalf("model spec: %+v", p.Model)
	}
	if p.Model.KeyHash != store.HashModelKey("mk-echo-1") || strings.Contains(p.Model.KeyHash, "mk-echo") {
		t.Fatalf("model key must be stored hashed, got %q", p.Model.KeyHash)
	}
}

func TestParseSandboxFields(t *testing.T) {
	ps, err := Parse([]byte("projects:\n  - {id: a, team: t, modelKey: k, command: [x], memoryMiB: 200, pidsMax: 64, network: host}\n"), "/x")
	if err != nil {
		t.Fatal(err)
	}
	if m := ps[0].Model; m.MemoryMiB != 200 || m.PidsMax != 64 || m.Network != store.NetworkHost {
		t.Fatalf("sandbox fields: memoryMiB %d, pidsMax %d, network %q", m.MemoryMiB, m.PidsMax, m.Network)
	}
	ps, err = Parse([]byte("projects:\n  - {id: a, team: t, modelKey: k, command: [x]}\n"), "/x")
	if err != nil {
		t.Fatal(err)
	}
	if m := ps[0].Model; m.MemoryMiB != 0 || m.PidsMax != 0 || m.Network != "" {
		t.Fatalf("absent sandbox fields should stay unset (no limit, the daemon's network): %+v", m)
	}
}

func TestParseBatch(t *testing.T) {
	ps, err := Parse([]byte("projects:\n  - {id: a, team: t, modelKey: k, command: [x], inferPath: /p, batch: {maxSize: 16, maxWaitMs: 5}}\n"), "/x")
	if err != nil {
		t.Fatal(err)
	}
	if m := ps[0].Model; m.Batch != (store.BatchSpec{MaxSize: 16, MaxWaitMs: 5}) || m.BatchPath != "/p" {
		t.Fatalf("batch %+v to %q, want maxSize 16, maxWaitMs 5 to the inferPath /p", m.Batch, m.BatchPath)
	}
	ps, err = Parse([]byte("projects:\n  - {id: a, team: t, modelKey: k, command: [x]}\n"), "/x")
	if err != nil {
		t.Fatal(err)
	}
	if ps[0].Model.Batch.On() {
		t.Fatalf("batching is on by default: %+v", ps[0].Model.Batch)
	}
}

func TestParseAppliesDefaults(t *testing.T) {
	ps, err := Parse([]byte("projects:\n  - {id: tiny, team: t, modelKey: k, command: [./run]}\n"), "/x")
	if err != nil {
		t.Fatal(err)
	}
	p := ps[0]
	if p.MinReplicas != 0 || p.MaxReplicas != 3 || p.InferenceTimeout != 300 || p.IdleTimeout != 30 || p.Retries != 0 ||
		p.Model.Concurrency != 1 || p.Model.BootTimeout != 600 || p.Model.Protocol != "http" || p.Model.Dir != filepath.Clean("/x") {
		t.Fatalf("defaults not applied: %+v", p)
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"empty file", "", "empty"},
		{"no projects", "projects: []\n", "no projects"},
		{"unknown field", "projects:\n  - {id: a, team: t, modelKey: k, command: [x], replicas: 2}\n", "replicas"},
		{"hash instead of modelKey", "projects:\n  - {id: a, team: t, modelKey: k, keyHash: abc, command: [x]}\n", "keyHash"},
		{"wrong type", "projects:\n  - {id: a, team: t, modelKey: k, command: [x], maxReplicas: many}\n", "many"},
		{"bad id", "projects:\n  - {id: Bad_Id, team: t, modelKey: k, command: [x]}\n", "id"},
		{"missing modelKey", "projects:\n  - {id: a, team: t, command: [x]}\n", "modelKey"},
		{"missing team", "projects:\n  - {id: a, modelKey: k, command: [x]}\n", "team"},
		{"missing command", "projects:\n  - {id: a, team: t, modelKey: k}\n", "command"},
		{"min above max", "projects:\n  - {id: a, team: t, modelKey: k, command: [x], minReplicas: 5, maxReplicas: 2}\n", "minReplicas"},
		{"bad protocol", "projects:\n  - {id: a, team: t, modelKey: k, command: [x], protocol: grpc}\n", "protocol"},
		{"bad network", "projects:\n  - {id: a, team: t, modelKey: k, command: [x], network: bridge}\n", "network"},
		{"tiny memoryMiB", "projects:\n  - {id: a, team: t, modelKey: k, command: [x], memoryMiB: 1}\n", "memoryMiB"},
		{"batch of one", "projects:\n  - {id: a, team: t, modelKey: k, command: [x], batch: {maxSize: 1}}\n", "model.batch.maxSize: must be between 2 and 1024"},
		{"potassium batch", "projects:\n  - {id: a, team: t, modelKey: k, command: [x], protocol: potassium, batch: {maxSize: 4}}\n",
			`project a: model.batch: protocol "potassium" cannot batch`},
		{"duplicate id", "projects:\n  - {id: a, team: t, modelKey: k, command: [x]}\n  - {id: a, team: t, modelKey: j, command: [x]}\n", "twice"},
		{"not yaml", "projects: [\n", "line 1: did not find expected node content"},
		// yaml.v3 itself says line 1, where the project list began.
		{"indentation", "projects:\n  - id: a\n    team: t\n    modelKey: k\n   command: [x]\n", "line 5: did not find expected '-' indicator (check its indentation"},
		{"indentation after a multi-line list", "projects:\n  - id: a\n    team: t\n    command: [\n      x]\n    env:\n      A: b\n     C: d\n", "line 8: did not find expected key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.body), "/x")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(echoManifest))
	f.Add([]byte("projects:\n  - {id: a, team: t, modelKey: k, command: [x]}\n"))
	f.Add([]byte("projects: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := Parse(data, "/x")
		if err != nil {
			return
		}
		for _, p := range ps {
			if err := p.Validate(); err != nil {
				t.Fatalf("Parse returned an invalid project: %v", err)
			}
		}
	})
}

// Mistakes in a manifest are told in the manifest's words: the line, the
// field, the project, what the field takes, and for a typo the field meant;
// never the Go types the decoder uses.
func TestParseErrorsNameFieldAndProject(t *testing.T) {
	entry := func(extra string) string {
		return "projects:\n  - id: echo\n    team: demo\n    modelKey: mk-1\n    command: [python3, server.py]\n" + extra
	}
	tests := []struct {
		name, body, want string
	}{
		{"typo", entry("    maxReplica: 2\n"),
			"line 6: unknown field maxReplica in project echo (did you mean maxReplicas?)"},
		{"other case", entry("    MaxReplicas: 2\n"),
			"line 6: unknown field MaxReplicas in project echo (did you mean maxReplicas?)"},
		{"nothing close", entry("    colour: red\n"),
			"line 6: unknown field colour in project echo"},
		{"top level", "project:\n  - {id: a}\n",
			"line 1: unknown field project at the top level (did you mean projects?)"},
		{"entry without id", "projects:\n  - {team: t, modelKey: k, command: [x], gpu: 1}\n",
			"line 2: unknown field gpu in project #1 (did you mean gpus?)"},
		{"second entry", entry("  - {id: other, team: t, modelKey: k, command: [x], idletimeout: 5}\n"),
			"line 6: unknown field idletimeout in project other (did you mean idleTimeout?)"},
		{"not a number", entry("    maxReplicas: many\n"),
			`line 6: maxReplicas in project echo must be a whole number, not "many"`},
		{"not a number, flow style", "projects:\n  - {id: a, team: t, modelKey: k, command: [x], gpus: two}\n",
			`line 2: gpus in project a must be a whole number, not "two"`},
		{"not a list", "projects:\n  - id: echo\n    command: python3 server.py\n",
			`line 3: command in project echo must be a list of strings, not "python3 server.py"`},
		{"batch typo", entry("    batch: {maxsize: 4}\n"),
			"line 6: unknown field maxsize in project echo (did you mean maxSize?)"},
		{"not a mapping", entry("    env: [A, B]\n"),
			"line 6: env in project echo must be a mapping of names to strings, not a list"},
		{"two mistakes", entry("    maxReplica: 2\n    gpus: two\n"),
			`line 6: unknown field maxReplica in project echo (did you mean maxReplicas?); line 7: gpus in project echo must be a whole number, not "two"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.body), "/x")
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n  %s\nwant\n  %s", err, tc.want)
			}
			for _, goWords := range []string{"manifest.", "not found in type", "unmarshal", "[]", "map[", "!!"} {
				if strings.Contains(err.Error(), goWords) {
					t.Errorf("error %q shows the decoder's Go words (%q)", err, goWords)
				}
			}
		})
	}
}

func TestSuggestPicksTheClosestNameOrNone(t *testing.T) {
	names := []string{"gpuMemoryMiB", "gpus", "idleTimeout", "inferenceTimeout", "maxReplicas", "minReplicas"}
	for name, want := range map[string]string{
		"maxReplica": "maxReplicas", "minreplicas": "minReplicas", "gpu": "gpus", "gpuMemoryMB": "gpuMemoryMiB",
		"idleTimout": "idleTimeout", "colour": "", "x": "", "replicas": "maxReplicas",
	} {
		if got := suggest(name, names); got != want {
			t.Errorf("suggest(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestParseDurability: durability is strict unless a project says answered;
// strict is the default, and stored as none; anything else is refused,
// naming the field.
func TestParseDurability(t *testing.T) {
	for _, tc := range []struct {
		value, want, err string
	}{
		{"", "", ""},
		{"durability: strict", "", ""},
		{"durability: answered", store.DurabilityAnswered, ""},
		{"durability: eventually", "", "durability"},
	} {
		extra := ""
		if tc.value != "" {
			extra = ", " + tc.value
		}
		ps, err := Parse([]byte("projects:\n  - {id: a, team: t, modelKey: k, command: [x]"+extra+"}\n"), "/x")
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: Parse = %v, want an error naming %s", tc.value, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q: Parse = %v", tc.value, err)
		case ps[0].Durability != tc.want || ps[0].AnswersFirst() != (tc.want == store.DurabilityAnswered):
			t.Errorf("%q: durability %q, want %q", tc.value, ps[0].Durability, tc.want)
		}
	}
}
