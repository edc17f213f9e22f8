package store

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// What the OpenAI front door (docs/openai.md) keeps in the store: the names
// by which a request's "model" finds a project of protocol openai, and the
// tokens a call used.

// Tokens is what an OpenAI-compatible model reported a call used (its
// reply's or its stream's last "usage"). The usage ledger adds them up per
// team and project as it adds the other measures of Call.
type Tokens struct {
	Prompt     int64 `json:"prompt"`
	Completion int64 `json:"completion"`
}

// Total is prompt and completion tokens together.
func (t Tokens) Total() int64 { return AddCount(t.Prompt, t.Completion) }

// MaxTokens is the most tokens one call may be counted for, of each kind:
// the largest integer a JSON reader that holds numbers as doubles (every
// JavaScript client) reads exactly. A model that reports more is clamped
// to it, as one that reports a negative count is to 0.
const MaxTokens = 1<<53 - 1

// ClampTokens is n as a call's token count: within [0, MaxTokens].
func ClampTokens(n int64) int64 { return min(max(n, 0), MaxTokens) }

// ModelNames returns the names an OpenAI request may give as "model" to
// reach p: its id, then its aliases. Projects of other protocols have none.
func (p Project) ModelNames() []string {
	if p.Model.Protocol != ProtocolOpenAI {
		return nil
	}
	return append([]string{p.ID}, p.Model.Aliases...)
}

// ServedModelName is the "model" inferd sends the server: ServedModel, or
// the project id.
func (p Project) ServedModelName() string {
	if p.Model.ServedModel != "" {
		return p.Model.ServedModel
	}
	return p.ID
}

// ResolveModel returns the project among projects (those a key may call)
// that an OpenAI request's model names: the one with that id, else the one
// with that alias (CheckModelNames keeps a name to one project per team; an
// admin key seeing several teams gets the first by id). Only projects of
// protocol openai answer.
func ResolveModel(projects []Project, model string) (Project, bool) {
	var alias *Project
	for i := range projects {
		p := &projects[i]
		if p.Model.Protocol != ProtocolOpenAI {
			continue
		}
		if p.ID == model {
			return *p, true
		}
		if slices.Contains(p.Model.Aliases, model) && (alias == nil || p.ID < alias.ID) {
			alias = p
		}
	}
	if alias != nil {
		return *alias, true
	}
	return Project{}, false
}

// CheckModelNames reports a *ValidationError when two projects of a team
// (projects: every project of it, as they would be) answer to the same
// model name, an alias of one being the id or an alias of another: a
// request's model must name one project.
func CheckModelNames(projects []Project) error {
	owner := map[string]string{}
	for _, p := range projects {
		if p.Model.Protocol == ProtocolOpenAI {
			owner[p.ID] = p.ID
		}
	}
	for _, p := range projects {
		for _, a := range p.ModelNames()[min(1, len(p.ModelNames())):] {
			if o, ok := owner[a]; ok && o != p.ID {
				return invalid("model.aliases", "alias %q of project %s is already a model name of project %s", a, p.ID, o)
			}
			owner[a] = p.ID
		}
	}
	return nil
}

// validateNames checks the aliases and servedModel of a model spec.
func (m ModelSpec) validateNames() error {
	if len(m.Aliases) > MaxAliases {
		return invalid("model.aliases", "at most %d aliases", MaxAliases)
	}
	for i, a := range m.Aliases {
		if err := checkModelName(a); err != nil {
			return invalid("model.aliases", "alias %q: %v", a, err)
		}
		if slices.Contains(m.Aliases[:i], a) {
			return invalid("model.aliases", "alias %q is listed twice", a)
		}
	}
	if m.ServedModel != "" {
		if err := checkModelName(m.ServedModel); err != nil {
			return invalid("model.servedModel", "%v", err)
		}
	}
	return nil
}

// checkModelName accepts 1 to MaxModelNameLen printable characters without
// spaces: model names such as "meta-llama/Llama-3.1-8B-Instruct" or
// "qwen2.5:7b" travel in JSON and URLs.
func checkModelName(s string) error {
	if s == "" || len(s) > MaxModelNameLen {
		return fmt.Errorf("must be 1 to %d characters", MaxModelNameLen)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }); i >= 0 {
		return fmt.Errorf("must not hold spaces or control characters (at byte %d)", i)
	}
	return nil
}
