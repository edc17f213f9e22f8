package cli

import (
	"encoding/csv"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/store"
	"inferd/store/bolt"
)

func TestUsagePrintsTheLedgerAsCSV(t *testing.T) {
	r, dataDir := runInProcess(t, "team", "set", "acme")
	if r.code != 0 {
		t.Fatalf("team set: %q", r.stderr)
	}
	st, err := bolt.Open(filepath.Join(dataDir, "inferd.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	cpu := 1.25
	if err := st.AddUsage([]store.UsageRow{
		{Hour: hour, TeamID: "acme", ProjectID: "echo", UsageTotals: store.UsageTotals{Calls: 3, ReplicaSeconds: 1.5, CPUSeconds: &cpu, IdleReplicaSeconds: 60,
			PromptTokens: 120, CompletionTokens: 45}},
		{Hour: hour, TeamID: "labs", ProjectID: "big", UsageTotals: store.UsageTotals{Calls: 1, BootReplicaSeconds: 12}},
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	out := runCLI(t, nil, "--data-dir", dataDir, "usage")
	if out.code != 0 {
		t.Fatalf("usage: exit %d, stderr %q", out.code, out.stderr)
	}
	recs, err := csv.NewReader(strings.NewReader(out.stdout)).ReadAll()
	if err != nil {
		t.Fatalf("not CSV: %v\n%s", err, out.stdout)
	}
	if len(recs) != 3 || strings.Join(recs[0][:5], ",") != "team,project,calls,failed,queueSeconds" {
		t.Fatalf("CSV = %q; want a header and two rows", recs)
	}
	col := func(name string) int {
		for i, h := range recs[0] {
			if h == name {
				return i
			}
		}
		t.Fatalf("no column %s in %q", name, recs[0])
		return -1
	}
	acme, labs := recs[1], recs[2]
	if acme[0] != "acme" || acme[col("calls")] != "3" || acme[col("cpuSeconds")] != "1.250" || acme[col("idleReplicaSeconds")] != "60.000" ||
		acme[col("promptTokens")] != "120" || acme[col("completionTokens")] != "45" {
		t.Errorf("acme's row = %q", acme)
	}
	if labs[col("bootReplicaSeconds")] != "12.000" || labs[col("cpuSeconds")] != "" || labs[col("energyJoules")] != "" {
		t.Errorf("labs' row = %q; want 12 s booting, cpu and energy empty (not measured)", labs)
	}
	byTeam := runCLI(t, nil, "--data-dir", dataDir, "usage", "--group-by", "team", "--team", "labs")
	if byTeam.code != 0 || !strings.HasPrefix(byTeam.stdout, "team,calls,") || strings.Count(byTeam.stdout, "\n") != 2 || !strings.Contains(byTeam.stdout, "\nlabs,1,") {
		t.Errorf("usage --group-by team --team labs: exit %d, %q", byTeam.code, byTeam.stdout)
	}
	if bad := runCLI(t, nil, "--data-dir", dataDir, "usage", "--group-by", "color"); bad.code != 1 || !strings.Contains(bad.stderr, "groupBy") {
		t.Errorf("a bad --group-by: exit %d, stderr %q", bad.code, bad.stderr)
	}
}
