package config

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The reference docs/configuration.md is written by hand (it says more than
// the example's comments can) and checked here against config.example.yaml,
// which TestExampleFileMatchesDefaults already ties to defaults(): every key
// in the example has a table row with the same default and its environment
// variable, and every row names a key the example still has. The failure
// messages give the exact row to add or change.

const (
	examplePath = "../config.example.yaml"
	docPath     = "../docs/configuration.md"
)

// exampleKey is one leaf setting of config.example.yaml.
type exampleKey struct {
	key  string // dotted, e.g. "replica.stopGrace"
	def  string // the value as written, e.g. "10s"; "[]" for an empty list
	list bool   // a list or map value, which no environment variable can set
}

func exampleKeys(t *testing.T) []exampleKey {
	t.Helper()
	raw, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("parse %s: %v", examplePath, err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		t.Fatalf("%s is not a YAML mapping", examplePath)
	}
	var keys []exampleKey
	var walk func(prefix string, m *yaml.Node)
	walk = func(prefix string, m *yaml.Node) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			name, val := prefix+m.Content[i].Value, m.Content[i+1]
			switch val.Kind {
			case yaml.MappingNode:
				if len(val.Content) > 0 {
					walk(name+".", val)
					continue
				}
				keys = append(keys, exampleKey{key: name, def: "{}", list: true})
			case yaml.SequenceNode:
				val.Style = yaml.FlowStyle
				out, err := yaml.Marshal(val)
				if err != nil {
					t.Fatal(err)
				}
				keys = append(keys, exampleKey{key: name, def: strings.TrimSpace(string(out)), list: true})
			default:
				keys = append(keys, exampleKey{key: name, def: val.Value})
			}
		}
	}
	walk("", doc.Content[0])
	return keys
}

// docRow is one table row of docs/configuration.md whose first cell is a key.
type docRow struct {
	line           int
	key, def, env  string
	sectionHeading string
}

func docRows(t *testing.T) (rows map[string]docRow, headings map[string]bool) {
	t.Helper()
	raw, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	rows, headings = map[string]docRow{}, map[string]bool{}
	heading := ""
	for i, line := range strings.Split(string(raw), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			heading = strings.TrimSpace(h)
			headings[heading] = true
			continue
		}
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.Trim(strings.TrimSpace(cells[j]), "`")
		}
		if len(cells) < 4 {
			t.Fatalf("%s:%d: a key row needs 4 cells (key, default, environment, meaning): %s", docPath, i+1, line)
		}
		if prev, dup := rows[cells[0]]; dup {
			t.Fatalf("%s:%d: key %s is documented twice (also line %d)", docPath, i+1, cells[0], prev.line)
		}
		rows[cells[0]] = docRow{line: i + 1, key: cells[0], def: cells[1], env: cells[2], sectionHeading: heading}
	}
	return rows, headings
}

// section is the heading a key's row belongs under.
func section(key string) string {
	if top, _, ok := strings.Cut(key, "."); ok {
		return top
	}
	return "Top level"
}

func wantEnv(k exampleKey) string {
	if k.list {
		return "(file only)"
	}
	return EnvName(k.key)
}

func wantRow(k exampleKey) string {
	env := wantEnv(k)
	if !k.list {
		env = "`" + env + "`"
	}
	return fmt.Sprintf("| `%s` | `%s` | %s | <what it does; its comment in config.example.yaml> |", k.key, k.def, env)
}

func TestConfigurationDocCoversExample(t *testing.T) {
	keys := exampleKeys(t)
	if len(keys) < 10 {
		t.Fatalf("found only %d keys in %s; the parser is broken", len(keys), examplePath)
	}
	rows, headings := docRows(t)
	inExample := map[string]bool{}
	for _, k := range keys {
		inExample[k.key] = true
		row, ok := rows[k.key]
		if !ok {
			where := fmt.Sprintf("the table under %q", "## "+section(k.key))
			if !headings[section(k.key)] {
				where = fmt.Sprintf("a new section %q with the same table header as the others", "## "+section(k.key))
			}
			t.Errorf("%s does not document %s from %s; add this row to %s:\n%s",
				docPath, k.key, examplePath, where, wantRow(k))
			continue
		}
		if row.def != k.def {
			t.Errorf("%s:%d gives %s the default %q but %s has %q; change the row to:\n%s",
				docPath, row.line, k.key, row.def, examplePath, k.def, wantRow(k))
		}
		if row.env != wantEnv(k) {
			t.Errorf("%s:%d gives %s the environment column %q, want %q:\n%s",
				docPath, row.line, k.key, row.env, wantEnv(k), wantRow(k))
		}
		if row.sectionHeading != section(k.key) {
			t.Errorf("%s:%d: %s is under %q, move its row under %q",
				docPath, row.line, k.key, "## "+row.sectionHeading, "## "+section(k.key))
		}
	}
	for key, row := range rows {
		if !inExample[key] {
			t.Errorf("%s:%d documents %s, which %s does not have: remove the row, or add the key to %s and to defaults() in config/config.go",
				docPath, row.line, key, examplePath, examplePath)
		}
	}
}
