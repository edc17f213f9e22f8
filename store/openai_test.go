package store_test

import (
	"errors"
	"strings"
	"testing"

	"inferd/store"
)

func openaiProject(id string, aliases ...string) store.Project {
	p := store.NewProject(id, "t")
	p.Model.Protocol = store.ProtocolOpenAI
	p.Model.Aliases = aliases
	return p
}

// A request's model finds a project by id first, then by alias; projects of
// other protocols answer to no name.
func TestResolveModelByIDThenAlias(t *testing.T) {
	banana := store.NewProject("llama", "t") // protocol http: not an OpenAI model
	projects := []store.Project{banana, openaiProject("qwen", "llama", "small"), openaiProject("mistral")}
	for model, want := range map[string]string{"qwen": "qwen", "small": "qwen", "llama": "qwen", "mistral": "mistral", "gpt-4": ""} {
		p, ok := store.ResolveModel(projects, model)
		if ok != (want != "") || p.ID != want {
			t.Errorf("ResolveModel(%q) = %q, %v; want %q", model, p.ID, ok, want)
		}
	}
	// An id wins over another project's alias.
	if p, _ := store.ResolveModel([]store.Project{openaiProject("a", "b"), openaiProject("b")}, "b"); p.ID != "b" {
		t.Errorf("model b found %s, want the project whose id is b", p.ID)
	}
}

func TestCheckModelNamesRefusesAClash(t *testing.T) {
	var ve *store.ValidationError
	err := store.CheckModelNames([]store.Project{openaiProject("a", "x"), openaiProject("b", "x")})
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), `alias "x" of project b is already a model name of project a`) {
		t.Errorf("two projects with alias x: %v", err)
	}
	if err := store.CheckModelNames([]store.Project{openaiProject("a", "b"), openaiProject("b")}); err == nil {
		t.Error("an alias equal to another project's id was accepted")
	}
	if err := store.CheckModelNames([]store.Project{openaiProject("a", "x", "y"), openaiProject("b", "z"), store.NewProject("x2", "t")}); err != nil {
		t.Errorf("distinct names refused: %v", err)
	}
}

func TestModelNamesAreValidated(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*store.ModelSpec)
		field  string
	}{
		{"alias with a space", func(m *store.ModelSpec) { m.Aliases = []string{"my model"} }, "model.aliases"},
		{"empty alias", func(m *store.ModelSpec) { m.Aliases = []string{""} }, "model.aliases"},
		{"alias twice", func(m *store.ModelSpec) { m.Aliases = []string{"a", "a"} }, "model.aliases"},
		{"served name too long", func(m *store.ModelSpec) { m.ServedModel = strings.Repeat("m", store.MaxModelNameLen+1) }, "model.servedModel"},
		{"batching", func(m *store.ModelSpec) { m.Batch = store.BatchSpec{MaxSize: 4} }, "model.batch"},
		{"a hub name", func(m *store.ModelSpec) {
			m.Aliases = []string{"meta-llama/Llama-3.1-8B-Instruct", "qwen2.5:7b"}
			m.ServedModel = "meta-llama/Llama-3.1-8B-Instruct"
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := openaiProject("llm")
			p.Model.Command = []string{"/usr/bin/vllm"}
			p.Model.KeyHash = store.HashModelKey("k")
			tc.change(&p.Model)
			err := p.Validate()
			var ve *store.ValidationError
			switch {
			case tc.field == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.field != "" && (!errors.As(err, &ve) || ve.Field != tc.field):
				t.Errorf("got %v, want an error on %s", err, tc.field)
			}
		})
	}
}

func TestOpenAIDefaults(t *testing.T) {
	m := store.ModelSpec{Protocol: store.ProtocolOpenAI}.WithDefaults()
	if m.HealthPath != "/v1/models" || m.InferPath != "/v1/chat/completions" {
		t.Errorf("openai defaults: health %s, infer %s", m.HealthPath, m.InferPath)
	}
	if got := openaiProject("llm").ServedModelName(); got != "llm" {
		t.Errorf("served name %q, want the project id", got)
	}
}
