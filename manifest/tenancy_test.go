package manifest

import (
	"strings"
	"testing"

	"inferd/store"
)

func TestParseTeamsAndCaps(t *testing.T) {
	m, err := ParseManifest([]byte(`
teams:
  - {id: acme, quota: {replicas: 8, gpus: 2, cpuSlots: 2, queuedCalls: 5000, queuedBytes: 2GiB, runningCalls: 32}}
  - {id: labs}
projects:
  - {id: echo, team: acme, modelKey: k, command: [./run], caps: {maxReplicas: 4, minReplicas: 1}}
`), "/x")
	if err != nil {
		t.Fatal(err)
	}
	want := store.Quota{Replicas: 8, GPUs: 2, CPUSlots: 2, QueuedCalls: 5000, QueuedBytes: 2 << 30, RunningCalls: 32}
	if len(m.Teams) != 2 || m.Teams[0].ID != "acme" || m.Teams[0].Quota != want || m.Teams[1].Quota != (store.Quota{}) {
		t.Errorf("teams = %+v", m.Teams)
	}
	if len(m.Projects) != 1 || m.Projects[0].Caps != (store.ProjectCaps{MaxReplicas: 4, MinReplicas: 1}) {
		t.Errorf("projects = %+v", m.Projects)
	}
	if teamsOnly, err := ParseManifest([]byte("teams:\n  - {id: acme, quota: {replicas: 1}}\n"), "/x"); err != nil || len(teamsOnly.Teams) != 1 {
		t.Errorf("a manifest of teams alone = %+v, %v", teamsOnly, err)
	}
}

func TestParseTeamsErrorsNameTheTeamAndField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown quota field", "teams:\n  - {id: acme, quota: {replica: 8}}\n", "replica"},
		{"bad size", "teams:\n  - {id: acme, quota: {queuedBytes: 2 parsecs}}\n", "queuedBytes"},
		{"negative", "teams:\n  - {id: acme, quota: {gpus: -1}}\n", "team acme: quota.gpus"},
		{"bad id", "teams:\n  - {id: Acme Corp}\n", "team Acme Corp"},
		{"twice", "teams:\n  - {id: acme}\n  - {id: acme}\n", "team acme: listed twice"},
		{"bad cap", "projects:\n  - {id: e, team: a, modelKey: k, command: [./r], caps: {maxReplicas: -1}}\n", "caps.maxReplicas"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseManifest([]byte(tc.yaml), "/x")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
