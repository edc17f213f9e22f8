package cli

import (
	"strings"
	"testing"
)

func TestTeamSetAndListShowTheQuota(t *testing.T) {
	r, dataDir := runInProcess(t, "team", "set", "acme", "--replicas", "8", "--gpus", "2", "--queued-bytes", "2GiB")
	if r.code != 0 || !strings.Contains(r.stdout, "Team acme: quota replicas=8 gpus=2 queuedBytes=2147483648.") {
		t.Fatalf("team set: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	list := runCLI(t, nil, "--data-dir", dataDir, "team", "list")
	// No daemon runs: use is unknown ("-"), quotas are shown, unlimited as "-".
	if list.code != 0 || !strings.Contains(list.stdout, "acme  -/8       -/2") || !strings.Contains(list.stdout, "-/2147483648") {
		t.Errorf("team list: exit %d, stdout %q, stderr %q", list.code, list.stdout, list.stderr)
	}
	for _, args := range [][]string{
		{"team", "set"},
		{"team", "set", "acme", "--queued-bytes", "lots"},
		{"team", "set", "acme", "--gpus", "two"},
	} {
		if r := runCLI(t, nil, append([]string{"--data-dir", dataDir}, args...)...); r.code != 2 {
			t.Errorf("inferd %v: exit %d, stderr %q; want a usage error", args, r.code, r.stderr)
		}
	}
	if r := runCLI(t, nil, "--data-dir", dataDir, "team", "set", "acme", "--gpus", "-1"); r.code != 1 || !strings.Contains(r.stderr, "quota.gpus") {
		t.Errorf("negative quota: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestKeyCreateWithScopeExpiryAndProjects(t *testing.T) {
	r, dataDir := runInProcess(t, "key", "create", "--team", "acme", "--scope", "read", "--expires", "30d", "--projects", "a,b")
	if r.code != 0 || !strings.Contains(r.stdout, "Created read key") {
		t.Fatalf("key create: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	list := runCLI(t, nil, "--data-dir", dataDir, "key", "list")
	if list.code != 0 || !strings.Contains(list.stdout, "EXPIRES") || !strings.Contains(list.stdout, " read ") ||
		!strings.Contains(list.stdout, " a,b ") || strings.Contains(list.stdout, "never") {
		t.Errorf("key list: exit %d, stdout %q", list.code, list.stdout)
	}
	for _, args := range [][]string{
		{"key", "create", "--team", "acme", "--scope", "admin"},
		{"key", "create", "--team", "acme", "--expires", "soon"},
		{"key", "create", "--team", "acme", "--expires", "-1d"},
		{"key", "create", "--admin", "--scope", "read"},
	} {
		if r := runCLI(t, nil, append([]string{"--data-dir", dataDir}, args...)...); r.code != 2 {
			t.Errorf("inferd %v: exit %d, stderr %q; want a usage error", args, r.code, r.stderr)
		}
	}
}

func TestTeamWebhookSecretIsStableUntilRotated(t *testing.T) {
	r, dataDir := runInProcess(t, "key", "create", "--team", "acme")
	if r.code != 0 {
		t.Fatalf("key create: exit %d, stderr %q", r.code, r.stderr)
	}
	secret := func(args ...string) string {
		t.Helper()
		r := runCLI(t, nil, append([]string{"--data-dir", dataDir, "team", "webhook-secret"}, args...)...)
		if r.code != 0 {
			t.Fatalf("team webhook-secret %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
		return strings.TrimSpace(r.stdout)
	}
	first := secret("acme")
	if !strings.HasPrefix(first, "whsec_") {
		t.Fatalf("secret %q is not in the whsec_ form", first)
	}
	if again := secret("acme"); again != first {
		t.Errorf("the secret changed without --rotate")
	}
	rotated := secret("acme", "--rotate")
	if rotated == first || !strings.HasPrefix(rotated, "whsec_") {
		t.Errorf("--rotate gave %q (first %q)", rotated, first)
	}
	if now := secret("acme"); now != rotated {
		t.Errorf("after --rotate the secret is %q, want the rotated one", now)
	}
	r = runCLI(t, nil, "--data-dir", dataDir, "team", "webhook-secret", "nobody")
	if r.code == 0 || !strings.Contains(r.stderr, "team nobody not found") {
		t.Errorf("unknown team: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, nil, "--data-dir", dataDir, "team", "webhook-secret")
	if r.code != 2 {
		t.Errorf("no team: exit %d, want 2", r.code)
	}
}

// key create --admin keeps its key under a team called admin, which is no
// tenant: team list leaves it out while it holds only admin keys, and shows
// a team that has an admin key beside its own.
func TestTeamListLeavesOutTheTeamThatOnlyHoldsAdminKeys(t *testing.T) {
	r, dataDir := runInProcess(t, "key", "create", "--admin")
	if r.code != 0 || !strings.Contains(r.stdout, "Created admin key") || !strings.Contains(r.stdout, "reaches every team") || strings.Contains(r.stdout, "for team admin") {
		t.Fatalf("key create --admin: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	for _, args := range [][]string{{"key", "create", "--team", "acme"}, {"key", "create", "--team", "acme", "--admin"}} {
		if r := runCLI(t, nil, append([]string{"--data-dir", dataDir}, args...)...); r.code != 0 {
			t.Fatalf("inferd %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	list := runCLI(t, nil, "--data-dir", dataDir, "team", "list")
	if list.code != 0 || strings.Contains(list.stdout, "admin") || !strings.Contains(list.stdout, "acme") {
		t.Errorf("team list: exit %d, stdout %q; want acme and no admin", list.code, list.stdout)
	}
}
