// Package manifest reads the declarative projects file that `inferd apply -f`
// upserts. Parsing is strict: an unknown field or a value of the wrong type is an
// error naming the project and the field, so a typo never deploys silently.
package manifest

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	"inferd/store"
)

// File is the manifest as written.
type File struct {
	Teams    []Team    `yaml:"teams"`
	Projects []Project `yaml:"projects"`
}

// Manifest is a parsed, validated manifest: the teams it sets quotas for
// and the projects it upserts.
type Manifest struct {
	Teams    []store.Team
	Projects []store.Project
}

// Team is one teams: entry: an admin's quota for a team (see store.Quota;
// an absent field is unlimited).
type Team struct {
	ID    string `yaml:"id"`
	Quota Quota  `yaml:"quota"`
}

// Quota is store.Quota as written, with queuedBytes a size ("2GiB").
type Quota struct {
	Replicas     int      `yaml:"replicas"`
	GPUs         int      `yaml:"gpus"`
	CPUSlots     int      `yaml:"cpuSlots"`
	QueuedCalls  int      `yaml:"queuedCalls"`
	QueuedBytes  byteSize `yaml:"queuedBytes"`
	RunningCalls int      `yaml:"runningCalls"`
}

// byteSize is a number of bytes written as a plain number or with a unit
// (store.ParseBytes: KiB, MiB, GiB, kB, MB, GB).
type byteSize int64

func (b *byteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: queuedBytes must be a size such as 2GiB", n.Line)
	}
	v, err := store.ParseBytes(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: queuedBytes: %w", n.Line, err)
	}
	*b = byteSize(v)
	return nil
}

// Project is one entry of the manifest: its id, team and modelKey, the
// model spec inline (store.ModelSpec, with the same field names as the
// store and the admin API), the four replica settings and retries. Their pointers
// tell "absent" (take the default) from an explicit zero; a zero in the
// model spec takes the spec's default.
type Project struct {
	ID               string `yaml:"id"`
	Team             string `yaml:"team"`
	ModelKey         string `yaml:"modelKey"`
	store.ModelSpec  `yaml:",inline"`
	MinReplicas      *int `yaml:"minReplicas"`
	MaxReplicas      *int `yaml:"maxReplicas"`
	InferenceTimeout *int `yaml:"inferenceTimeout"`
	IdleTimeout      *int `yaml:"idleTimeout"`
	Retries          *int `yaml:"retries"` // default 0; see store.Project.Retries
	// Durability is "strict" (the default) or "answered"; see
	// store.Project.Durability.
	Durability string `yaml:"durability"`
	// Caps bound what the team may set through the project API.
	Caps store.ProjectCaps `yaml:"caps"`
}

// Parse decodes a manifest and turns it into validated store projects. baseDir
// is the manifest's directory: a relative `dir`, `image`,
// `python.requirements` or `python.wheelhouse` is resolved against it.
func Parse(data []byte, baseDir string) ([]store.Project, error) {
	m, err := ParseManifest(data, baseDir)
	return m.Projects, err
}

// ParseManifest is Parse with the manifest's teams: entries too. A manifest
// may list teams alone (to set quotas) or projects alone.
func ParseManifest(data []byte, baseDir string) (Manifest, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return Manifest{}, errors.New("manifest is empty: it needs a projects: list")
		}
		return Manifest{}, describe(data, err)
	}
	if len(f.Projects) == 0 && len(f.Teams) == 0 {
		return Manifest{}, errors.New("manifest has no projects")
	}
	teams, err := f.teams()
	if err != nil {
		return Manifest{}, err
	}
	seen := map[string]bool{}
	out := make([]store.Project, 0, len(f.Projects))
	for i, mp := range f.Projects {
		name := mp.ID
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
		}
		if seen[mp.ID] {
			return Manifest{}, fmt.Errorf("project %s: listed twice", name)
		}
		seen[mp.ID] = true
		p, err := mp.toStore(baseDir)
		if err != nil {
			return Manifest{}, fmt.Errorf("project %s: %w", name, err)
		}
		out = append(out, p)
	}
	return Manifest{Teams: teams, Projects: out}, nil
}

// teams validates the teams: entries.
func (f File) teams() ([]store.Team, error) {
	seen := map[string]bool{}
	var out []store.Team
	for i, t := range f.Teams {
		name := t.ID
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
		}
		if err := store.ValidateTeamID(t.ID); err != nil {
			return nil, fmt.Errorf("team %s: %w", name, err)
		}
		if seen[t.ID] {
			return nil, fmt.Errorf("team %s: listed twice", name)
		}
		seen[t.ID] = true
		q := store.Quota{Replicas: t.Quota.Replicas, GPUs: t.Quota.GPUs, CPUSlots: t.Quota.CPUSlots,
			QueuedCalls: t.Quota.QueuedCalls, QueuedBytes: int64(t.Quota.QueuedBytes), RunningCalls: t.Quota.RunningCalls}
		if err := q.Validate(); err != nil {
			return nil, fmt.Errorf("team %s: %w", name, err)
		}
		out = append(out, store.Team{ID: t.ID, Quota: q})
	}
	return out, nil
}

func (mp Project) toStore(baseDir string) (store.Project, error) {
	if mp.ModelKey == "" {
		return store.Project{}, errors.New("modelKey: required")
	}
	if mp.Team == "" {
		return store.Project{}, errors.New("team: required")
	}
	p := store.NewProject(mp.ID, mp.Team)
	setInt(&p.MinReplicas, mp.MinReplicas)
	setInt(&p.MaxReplicas, mp.MaxReplicas)
	setInt(&p.InferenceTimeout, mp.InferenceTimeout)
	setInt(&p.IdleTimeout, mp.IdleTimeout)
	setInt(&p.Retries, mp.Retries)
	if mp.Durability != store.DurabilityStrict {
		p.Durability = mp.Durability // strict, the default, is not stored
	}

	p.Model = mp.ModelSpec
	p.Model.KeyHash = store.HashModelKey(mp.ModelKey)
	if img := mp.Image; img != "" && !strings.HasPrefix(img, "sha256:") {
		abs, err := resolve(baseDir, img)
		if err != nil {
			return store.Project{}, fmt.Errorf("image: %w", err)
		}
		p.Model.Image = abs
	}
	for _, f := range []struct {
		name string
		path *string
	}{{"python.requirements", &p.Model.Python.Requirements}, {"python.wheelhouse", &p.Model.Python.Wheelhouse}} {
		if *f.path == "" {
			continue
		}
		abs, err := resolve(baseDir, *f.path)
		if err != nil {
			return store.Project{}, fmt.Errorf("%s: %w", f.name, err)
		}
		*f.path = abs
	}
	// A model in an image runs in the image's WorkingDir unless dir says
	// otherwise; any other runs in the manifest's directory.
	if mp.Dir != "" || mp.Image == "" {
		abs, err := resolve(baseDir, cmp.Or(mp.Dir, "."))
		if err != nil {
			return store.Project{}, fmt.Errorf("dir: %w", err)
		}
		p.Model.Dir = abs
	}
	p.Caps = mp.Caps
	p.ApplyDefaults()
	if err := p.Validate(); err != nil {
		return store.Project{}, err
	}
	return p, nil
}

// resolve makes p, relative to the manifest's directory, absolute.
func resolve(baseDir, p string) (string, error) {
	if !filepath.IsAbs(p) {
		p = filepath.Join(baseDir, p)
	}
	return filepath.Abs(p)
}

func setInt(dst *int, v *int) {
	if v != nil {
		*dst = *v
	}
}
