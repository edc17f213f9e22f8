package cli

import (
	"strings"
	"testing"
)

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
