package cli

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"time"

	ledger "inferd/httpapi/usage"
	"inferd/store"
)

// usageCommand prints the usage ledger (GET /admin/usage) as CSV.
type usageCommand struct{ env *env }

func (c *usageCommand) Usage() string {
	return `Usage:
  inferd [global flags] usage [--from TIME] [--to TIME] [--group-by project|team|hour[,...]] [--team T] [--json]

usage prints what each team and project used, from the usage ledger's
hourly roll-ups, as CSV with a header line: calls (and of them failed),
their queue, boot-wait and run seconds, the replica-seconds and GPU-seconds
of their calls, the CPU seconds and peak memory of their replicas' cgroups,
bytes in and out, GPU energy in joules, and the replica time no call used,
booting and idle, charged to the project that kept the replica. A measure
the box could not take (no cgroup v2, no NVML energy counter) is an empty
cell, never 0. TIME is RFC 3339 (2025-01-02T15:04:05Z) or a date
(2025-01-02); the default is the last 24 hours. --group-by sums by team,
project (with its team; the default) or hour, or several (hour,project).
--json prints the admin API's answer as it is.
`
}

func (c *usageCommand) Run(ctx context.Context, args []string) error {
	fs := subFlags("usage")
	from := fs.String("from", "", "start of the range (RFC 3339 or a date; default 24 h before --to)")
	to := fs.String("to", "", "end of the range (default now)")
	group := fs.String("group-by", "project", "team, project or hour; several separated by commas")
	team := fs.String("team", "", "one team only")
	asJSON := fs.Bool("json", false, "print the JSON answer instead of CSV")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	q := url.Values{"groupBy": {*group}}
	for name, v := range map[string]string{"from": *from, "to": *to, "team": *team} {
		if v != "" {
			q.Set(name, v)
		}
	}
	var rep ledger.Report
	if err := c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "GET", "/admin/usage?"+q.Encode(), nil, &rep)
	}); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(c.env.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return writeUsageCSV(c.env.stdout, rep)
}

// usageColumns are the CSV's figure columns, after the grouping ones.
var usageColumns = []struct {
	name  string
	value func(store.UsageTotals) string
}{
	{"calls", func(u store.UsageTotals) string { return strconv.FormatInt(u.Calls, 10) }},
	{"failed", func(u store.UsageTotals) string { return strconv.FormatInt(u.Failed, 10) }},
	{"queueSeconds", func(u store.UsageTotals) string { return seconds(u.QueueSeconds) }},
	{"bootWaitSeconds", func(u store.UsageTotals) string { return seconds(u.BootWaitSeconds) }},
	{"runSeconds", func(u store.UsageTotals) string { return seconds(u.RunSeconds) }},
	{"replicaSeconds", func(u store.UsageTotals) string { return seconds(u.ReplicaSeconds) }},
	{"gpuSeconds", func(u store.UsageTotals) string { return seconds(u.GPUSeconds) }},
	{"cpuSeconds", func(u store.UsageTotals) string { return optional(u.CPUSeconds) }},
	{"peakMemoryBytes", func(u store.UsageTotals) string { return strconv.FormatInt(u.PeakMemoryBytes, 10) }},
	{"bytesIn", func(u store.UsageTotals) string { return strconv.FormatInt(u.BytesIn, 10) }},
	{"bytesOut", func(u store.UsageTotals) string { return strconv.FormatInt(u.BytesOut, 10) }},
	{"energyJoules", func(u store.UsageTotals) string { return optional(u.EnergyJoules) }},
	{"bootReplicaSeconds", func(u store.UsageTotals) string { return seconds(u.BootReplicaSeconds) }},
	{"idleReplicaSeconds", func(u store.UsageTotals) string { return seconds(u.IdleReplicaSeconds) }},
	{"bootGPUSeconds", func(u store.UsageTotals) string { return seconds(u.BootGPUSeconds) }},
	{"idleGPUSeconds", func(u store.UsageTotals) string { return seconds(u.IdleGPUSeconds) }},
	{"promptTokens", func(u store.UsageTotals) string { return strconv.FormatInt(u.PromptTokens, 10) }},
	{"completionTokens", func(u store.UsageTotals) string { return strconv.FormatInt(u.CompletionTokens, 10) }},
}

func seconds(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

// optional is an absent measure's empty cell, or the value.
func optional(v *float64) string {
	if v == nil {
		return ""
	}
	return seconds(*v)
}

// writeUsageCSV writes the report's lines, with a header: the grouping
// columns (hour, team, project: those grouped by), then the figures.
func writeUsageCSV(out interface{ Write([]byte) (int, error) }, rep ledger.Report) error {
	w := csv.NewWriter(out)
	header := []string{}
	for _, g := range []string{"hour", "team", "project"} {
		if slices.Contains(rep.GroupBy, g) {
			header = append(header, g)
		}
	}
	keys := len(header)
	for _, c := range usageColumns {
		header = append(header, c.name)
	}
	if err := w.Write(header); err != nil {
		return err
	}
	for _, l := range rep.Results {
		rec := make([]string, 0, len(header))
		for _, g := range header[:keys] {
			switch g {
			case "hour":
				rec = append(rec, l.Hour.UTC().Format(time.RFC3339))
			case "team":
				rec = append(rec, l.TeamID)
			case "project":
				rec = append(rec, l.ProjectID)
			}
		}
		for _, c := range usageColumns {
			rec = append(rec, c.value(l.UsageTotals))
		}
		if err := w.Write(rec); err != nil {
			return err
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return fmt.Errorf("write CSV: %w", err)
	}
	return nil
}
