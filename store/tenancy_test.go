package store

import (
	"errors"
	"strings"
	"testing"
)

func TestQuotaCheckProjectsNamesTheQuotaOverrun(t *testing.T) {
	cpu := func(id string, min, max int) Project {
		p := NewProject(id, "acme")
		p.MinReplicas, p.MaxReplicas = min, max
		return p
	}
	gpu := func(id string, min, gpus int) Project {
		p := cpu(id, min, 8)
		p.Model.GPUs = gpus
		return p
	}
	for _, tc := range []struct {
		name     string
		q        Quota
		projects []Project
		want     string // "" = fits
	}{
		{"unlimited", Quota{}, []Project{cpu("a", 1000, 1000)}, ""},
		{"minimums fit", Quota{Replicas: 4}, []Project{cpu("a", 2, 4), cpu("b", 2, 3)}, ""},
		{"minimums over replicas", Quota{Replicas: 4}, []Project{cpu("a", 3, 4), cpu("b", 2, 3)}, "replicas quota of 4"},
		{"max over replicas", Quota{Replicas: 4}, []Project{cpu("a", 0, 5)}, "maxReplicas of project a would be 5"},
		{"gpu minimums", Quota{GPUs: 2}, []Project{gpu("a", 1, 2), gpu("b", 1, 1)}, "gpus quota of 2"},
		{"cpu minimums", Quota{CPUSlots: 1}, []Project{gpu("g", 1, 1), cpu("a", 2, 3)}, "cpuSlots quota of 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.q.CheckProjects("acme", tc.projects)
			var qe *QuotaError
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("CheckProjects = %v, want nil", err)
			case tc.want != "" && (!errors.As(err, &qe) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("CheckProjects = %v, want a QuotaError containing %q", err, tc.want)
			}
		})
	}
}

func TestProjectCheckCaps(t *testing.T) {
	p := NewProject("p", "acme")
	p.Caps = ProjectCaps{MaxReplicas: 4, MinReplicas: 1}
	p.MinReplicas, p.MaxReplicas = 1, 4
	if err := p.CheckCaps(); err != nil {
		t.Errorf("within caps: %v", err)
	}
	p.MaxReplicas = 5
	if err := p.CheckCaps(); err == nil || !strings.Contains(err.Error(), "caps.maxReplicas of 4") {
		t.Errorf("max over cap: %v", err)
	}
	p.MaxReplicas, p.MinReplicas = 4, 2
	if err := p.CheckCaps(); err == nil || !strings.Contains(err.Error(), "caps.minReplicas of 1") {
		t.Errorf("min over cap: %v", err)
	}
}

func TestParseBytesAndPermissions(t *testing.T) {
	for in, want := range map[string]int64{"2GiB": 2 << 30, "512 MiB": 512 << 20, "100kB": 100000, "7": 7, "3B": 3} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "2 parsecs", "99999999999TiB"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) succeeded", bad)
		}
	}
	ps, err := ParsePermissions("read, infer,read")
	if err != nil || len(ps) != 2 || ps[0] != PermRead || ps[1] != PermInfer {
		t.Errorf("ParsePermissions = %v, %v", ps, err)
	}
	if _, err := ParsePermissions("read,admin"); err == nil {
		t.Error("ParsePermissions accepted admin")
	}
	if k := (APIKey{KeyLimits: KeyLimits{Permissions: ps}}); k.ScopeText() != "read,infer" || !(APIKey{}).Allows(PermManage) {
		t.Errorf("ScopeText = %q", k.ScopeText())
	}
}
