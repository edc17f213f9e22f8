package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"time"
)

// What an apply writes over a stored project, as `kubectl apply` does it: a
// three-way merge of the manifest's declaration now, the one it made last
// time (Project.LastApplied) and the project as it is. A field the manifest
// changed since its last apply takes the manifest's value; a field it left as
// it was keeps the stored one, so what a team set through the project API
// (an idleTimeout, a maxReplicas) survives a re-apply of the same manifest.

// Declared returns p marked as a manifest's declaration: its LastApplied is
// p itself (without stamps), which Reapply merges with and the store keeps.
func (p Project) Declared() Project {
	d := p.Clone()
	d.LastApplied, d.Created, d.Updated = nil, time.Time{}, time.Time{}
	p.LastApplied = &d
	return p
}

// Reapply returns what the store writes when the declared project p (see
// Declared) is applied over stored, the project with p.ID as it is: each
// field the declaration changed since stored's LastApplied comes from p,
// each one it left unchanged keeps stored's value. A project without a
// LastApplied (created through the project API, or applied before inferd
// kept one) takes the declaration whole; so does a p that is no declaration.
// The result carries p's LastApplied, Created and Updated. A merge that is
// not a valid project (a kept maxReplicas below the declaration's new
// minReplicas) is a *ValidationError saying so.
func Reapply(stored, p Project) (Project, error) {
	if p.LastApplied == nil || stored.LastApplied == nil {
		return p, nil
	}
	last, errL := fields(*stored.LastApplied)
	next, errN := fields(*p.LastApplied)
	stored.LastApplied = nil
	live, errS := fields(stored)
	if err := firstError(errL, errN, errS); err != nil {
		return Project{}, fmt.Errorf("apply project %s: %w", p.ID, err)
	}
	merged, err := json.Marshal(merge3(last, next, live))
	if err != nil {
		return Project{}, fmt.Errorf("apply project %s: %w", p.ID, err)
	}
	var out Project
	if err := json.Unmarshal(merged, &out); err != nil {
		return Project{}, fmt.Errorf("apply project %s: %w", p.ID, err)
	}
	out.LastApplied, out.Created, out.Updated = p.LastApplied, p.Created, p.Updated
	if err := out.Validate(); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			ve.Reason += " (with the values set through the project API since the last apply kept: change them there, or in the manifest)"
		}
		return Project{}, err
	}
	return out, nil
}

// PutChange says what writing p over stored changes, for PutProjects:
// ChangeUpdated for other content, else ChangeUnchanged; write is true for
// an update, and for the same content with a new LastApplied, which is
// recorded without telling anyone (nothing that runs depends on it; an
// apply of projects stored before inferd kept declarations reports them
// unchanged).
func PutChange(stored, p Project) (change Change, write bool) {
	if SameContent(stored, p) {
		return ChangeUnchanged, false
	}
	stored.LastApplied, p.LastApplied = nil, nil
	if SameContent(stored, p) {
		return ChangeUnchanged, true
	}
	return ChangeUpdated, true
}

// fields is p's stored encoding as a JSON object, without its stamps.
func fields(p Project) (map[string]any, error) {
	p.Created, p.Updated = time.Time{}, time.Time{}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
}

// merge3 merges JSON objects field by field: a field whose declared value is
// the one last applied keeps its live value (absent stays absent); a field
// the declaration changed, added or dropped takes the declaration's (dropped:
// absent, so its default). An object in all three merges the same way inside.
func merge3(last, next, live map[string]any) map[string]any {
	out := map[string]any{}
	keys := maps.Clone(live)
	maps.Copy(keys, next)
	for k := range keys {
		pv, wasDeclared := last[k]
		nv, declared := next[k]
		lv, isLive := live[k]
		po, okP := pv.(map[string]any)
		no, okN := nv.(map[string]any)
		lo, okL := lv.(map[string]any)
		switch {
		case okP && okN && okL:
			out[k] = merge3(po, no, lo)
		case declared == wasDeclared && (!declared || reflect.DeepEqual(nv, pv)):
			if isLive {
				out[k] = lv // the declaration left it as it was
			}
		case declared:
			out[k] = nv
		}
	}
	return out
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ChangedFields names the fields whose values differ between a and b, as
// the manifest spells them (a model field by its own name, keyHash as
// modelKey), sorted; stamps and LastApplied are not compared. It tells an
// apply's user what an update changed.
func ChangedFields(a, b Project) []string {
	a.LastApplied, b.LastApplied = nil, nil
	fa, errA := fields(a)
	fb, errB := fields(b)
	if errA != nil || errB != nil {
		return nil
	}
	ma, _ := fa["model"].(map[string]any)
	mb, _ := fb["model"].(map[string]any)
	delete(fa, "model")
	delete(fb, "model")
	var out []string
	for _, pair := range []struct{ a, b map[string]any }{{fa, fb}, {ma, mb}} {
		keys := maps.Clone(pair.a)
		maps.Copy(keys, pair.b)
		for k := range keys {
			if !reflect.DeepEqual(pair.a[k], pair.b[k]) {
				if k == "keyHash" {
					k = "modelKey"
				}
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}
