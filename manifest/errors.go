package manifest

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// describe turns the YAML decoder's error into one in the manifest's own
// words. yaml.v3 names Go types ("field maxReplica not found in type
// manifest.Project", "cannot unmarshal !!str `many` into int"), which mean
// nothing to whoever wrote the manifest; this names the field and the project
// instead: "line 5: unknown field maxReplica in project echo (did you mean
// maxReplicas?)". The decoder still decides what is accepted; describe only
// rewords, and falls back to the decoder's text where it cannot place an error.
func describe(data []byte, err error) error {
	var te *yaml.TypeError
	var doc yaml.Node
	if !errors.As(err, &te) {
		return syntaxError(data, err)
	}
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return fmt.Errorf("manifest: %w", err)
	}
	msgs := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		msgs[i] = reword(doc.Content[0], e)
	}
	return errors.New(strings.Join(msgs, "; "))
}

// syntaxErr is how yaml.v3 words a syntax error: "yaml: line N: what".
var syntaxErr = regexp.MustCompile(`^yaml: line [0-9]+: (.*)$`)

// maxProbedLines bounds the manifests whose syntax errors syntaxError
// places by parsing prefixes (a parse per line: about a second at 2000).
const maxProbedLines = 2000

// syntaxError words a YAML syntax error with the line it is on. yaml.v3
// names the line where the enclosing block began (line 1 for a
// mis-indented field of a project, or a line above it), not the line that
// broke it: that is the first line whose prefix of the manifest fails to
// parse with the same error. Where none does, the decoder's text stays.
func syntaxError(data []byte, err error) error {
	m := syntaxErr.FindStringSubmatch(err.Error())
	lines := strings.SplitAfter(string(data), "\n")
	if m == nil || len(lines) > maxProbedLines {
		return fmt.Errorf("manifest: %w", err)
	}
	var doc yaml.Node
	for n := 1; n <= len(lines); n++ {
		// A prefix that ends inside a multi-line value fails too, with
		// another error ("did not find expected ',' or ']'"): only the
		// manifest's own error places it.
		perr := yaml.Unmarshal([]byte(strings.Join(lines[:n], "")), &doc)
		if perr == nil {
			continue
		}
		if pm := syntaxErr.FindStringSubmatch(perr.Error()); pm == nil || pm[1] != m[1] {
			continue
		}
		what := m[1]
		if strings.HasPrefix(what, "did not find expected") || strings.HasPrefix(what, "mapping values are not allowed") {
			what += " (check its indentation against the lines above)"
		}
		return fmt.Errorf("line %d: %s", n, what)
	}
	return fmt.Errorf("manifest: %w", err)
}

// field is one key of a mapping in the manifest, as walkFields finds it.
type field struct {
	key, value *yaml.Node
	known      *reflect.StructField // nil: the type has no such field
	candidates []string             // the names the mapping may hold
	where      string               // "project echo", or "" at the top level
}

// walkFields calls fn for each key of the mappings in n that decode into
// structs of type t (through slices and pointers), top down.
func walkFields(n *yaml.Node, t reflect.Type, where string, fn func(field)) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, item := range n.Content {
			w := where
			if t.Elem() == reflect.TypeFor[Project]() {
				w = "project " + projectName(item, i)
			}
			walkFields(item, t.Elem(), w, fn)
		}
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := yamlFields(t)
		names := slices.Sorted(maps.Keys(fields))
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			f := field{key: k, value: v, candidates: names, where: where}
			if sf, ok := fields[k.Value]; ok {
				f.known = &sf
			}
			fn(f)
			if f.known != nil {
				walkFields(v, f.known.Type, where, fn)
			}
		}
	}
}

// projectName is how errors name the i-th project entry: its id, as Parse
// names it, or its position when it has none.
func projectName(n *yaml.Node, i int) string {
	if n.Kind == yaml.MappingNode {
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == "id" && n.Content[j+1].Kind == yaml.ScalarNode && n.Content[j+1].Value != "" {
				return n.Content[j+1].Value
			}
		}
	}
	return fmt.Sprintf("#%d", i+1)
}

// yamlFields maps the YAML names of t's fields to the fields, reading the
// tags as yaml.v3 does (inlined structs included), so a field added to the
// manifest's types is known here without another list.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		sf := t.Field(i)
		name, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if strings.Contains(opts, "inline") {
			ft := sf.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				maps.Copy(out, yamlFields(ft))
			}
			continue
		}
		if !sf.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		out[name] = sf
	}
	return out
}

func unknownField(f field) string {
	msg := fmt.Sprintf("line %d: unknown field %s%s", f.key.Line, f.key.Value, in(f))
	if s := suggest(f.key.Value, f.candidates); s != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", s)
	}
	return msg
}

// suggest returns the candidate closest to name when it is close enough to
// be a typo (a few letters off, or in another case), else "". Candidates are
// sorted, so a tie goes to the first.
func suggest(name string, candidates []string) string {
	best, bestDist := "", len(name)/3+2
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), strings.ToLower(c)); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// The messages of yaml.v3's TypeError that reword rewrites: an unknown field
// (line, name) and a wrong type (line, YAML tag, the value for scalars).
var (
	unknownErr = regexp.MustCompile("^line ([0-9]+): field (.*) not found in type ")
	typeErr    = regexp.MustCompile("^line ([0-9]+): cannot unmarshal (!![a-z]+)(?: `(.*)`)? into ")
)

// reword rewrites one of yaml.v3's TypeError messages with the field and
// project it is about; a message it cannot place is returned as it is.
func reword(root *yaml.Node, msg string) string {
	var line int
	var match func(field) bool
	var say func(field) string
	if m := unknownErr.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		match = func(f field) bool { return f.known == nil && f.key.Line == line && f.key.Value == m[2] }
		say = unknownField
	} else if m := typeErr.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		// yaml.v3 cuts values longer than 10 bytes to 7 and "...".
		value, cut := strings.CutSuffix(m[3], "...")
		match = func(f field) bool {
			return f.known != nil && f.value.Line == line &&
				(m[3] == "" || f.value.Value == m[3] || cut && strings.HasPrefix(f.value.Value, value))
		}
		say = func(f field) string {
			got := yamlKind(m[2])
			if m[3] != "" {
				got = strconv.Quote(shorten(f.value.Value))
			}
			return fmt.Sprintf("line %d: %s%s must be %s, not %s", line, f.key.Value, in(f), kindWords(f.known.Type), got)
		}
	} else {
		return msg
	}
	out := msg
	found := false
	walkFields(root, reflect.TypeFor[File](), "", func(f field) {
		if !found && match(f) {
			out, found = say(f), true
		}
	})
	return out
}

// shorten keeps a value quoted in a message to one line's worth.
func shorten(v string) string {
	if r := []rune(v); len(r) > 40 {
		return string(r[:37]) + "..."
	}
	return v
}

// in says where a field is, for a message.
func in(f field) string {
	if f.where == "" {
		return " at the top level"
	}
	return " in " + f.where
}

// kindWords says what values of Go type t look like in YAML.
func kindWords(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list of " + strings.TrimPrefix(kindWords(t.Elem()), "a ") + "s"
	case reflect.Map:
		return "a mapping of names to " + strings.TrimPrefix(kindWords(t.Elem()), "a ") + "s"
	default:
		return "a mapping"
	}
}

// yamlKind names a YAML tag for a value the error did not quote.
func yamlKind(tag string) string {
	switch tag {
	case "!!seq":
		return "a list"
	case "!!map":
		return "a mapping"
	case "!!null":
		return "empty"
	}
	return "a " + strings.TrimPrefix(tag, "!!")
}
