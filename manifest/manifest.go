// Package manifest reads the declarative projects file that `inferd apply -f`
// upserts. Parsing is strict: an unknown field or a value of the wrong type is an
// error naming the project and the field, so a typo never deploys silently.
package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"gopkg.in/yaml.v3"

	"inferd/store"
)

// File is the manifest as written.
type File struct {
	Projects []Project `yaml:"projects"`
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
}

// Parse decodes a manifest and turns it into validated store projects. baseDir
// is the manifest's directory: a relative `dir` is resolved against it.
func Parse(data []byte, baseDir string) ([]store.Project, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("manifest is empty: it needs a projects: list")
		}
		return nil, describe(data, err)
	}
	if len(f.Projects) == 0 {
		return nil, errors.New("manifest has no projects")
	}
	seen := map[string]bool{}
	out := make([]store.Project, 0, len(f.Projects))
	for i, mp := range f.Projects {
		name := mp.ID
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
		}
		if seen[mp.ID] {
			return nil, fmt.Errorf("project %s: listed twice", name)
		}
		seen[mp.ID] = true
		p, err := mp.toStore(baseDir)
		if err != nil {
			return nil, fmt.Errorf("project %s: %w", name, err)
		}
		out = append(out, p)
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

	p.Model = mp.ModelSpec
	p.Model.KeyHash = store.HashModelKey(mp.ModelKey)
	dir := mp.Dir
	if dir == "" {
		dir = "."
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(baseDir, dir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return store.Project{}, fmt.Errorf("dir: %w", err)
	}
	p.Model.Dir = abs
	p.ApplyDefaults()
	if err := p.Validate(); err != nil {
		return store.Project{}, err
	}
	return p, nil
}

func setInt(dst *int, v *int) {
	if v != nil {
		*dst = *v
	}
}
