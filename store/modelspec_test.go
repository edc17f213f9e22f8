package store_test

import (
	"reflect"
	"strings"
	"testing"

	"inferd/store"
	"inferd/store/storetest"
)

// liveFields are the ModelSpec fields that running replicas take as they
// are (RestartNeeded ignores them).
var liveFields = map[string]bool{"KeyHash": true, "Concurrency": true, "Batch": true, "BootTimeout": true, "ParkTimeout": true, "Aliases": true, "ServedModel": true}

func TestRestartNeededForAChangeToAnyFieldButTheLiveOnes(t *testing.T) {
	p := store.NewProject("p", "t")
	p.Model.Command = []string{"/usr/bin/model"}
	p.Model.KeyHash = store.HashModelKey("key-p")
	p.Model.Env = map[string]string{"A": "1"}
	base := p.Model
	for _, name := range storetest.ModelSpecFields() {
		t.Run(name, func(t *testing.T) {
			next := storetest.ChangeModelSpecField(t, base, name)
			q := p
			q.Model = next
			if err := q.Validate(); err != nil {
				t.Fatalf("the changed spec is invalid: %v", err)
			}
			if got, want := base.RestartNeeded(next), !liveFields[name]; got != want {
				t.Errorf("RestartNeeded after a change to %s = %v, want %v", name, got, want)
			}
		})
	}
	if base.RestartNeeded(base) {
		t.Error("RestartNeeded of an unchanged spec")
	}
	// A spec whose defaults are spelled out is the same spec.
	bare := store.ModelSpec{KeyHash: base.KeyHash, Command: base.Command, Env: map[string]string{}}
	if bare.RestartNeeded(bare.WithDefaults()) {
		t.Error("RestartNeeded between a spec and itself with defaults filled in")
	}
}

// The manifest decodes a ModelSpec inline from YAML and the store and the
// admin API encode it as JSON: a field must have the same name in both (the
// modelKey hash and the restart count excepted, which no manifest may set).
func TestModelSpecFieldsHaveOneNameInJSONAndYAML(t *testing.T) {
	typ := reflect.TypeFor[store.ModelSpec]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		js, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ym, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case f.Name == "KeyHash", f.Name == "Restarts":
			if ym != "-" {
				t.Errorf("%s has yaml name %q, want - (no manifest sets it)", f.Name, ym)
			}
		case js == "" || js != ym:
			t.Errorf("field %s: json name %q, yaml name %q; want one name in both", f.Name, js, ym)
		}
	}
}
