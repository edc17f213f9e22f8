package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"inferd/bench/loadgen"
)

// The OpenAI door beside /start/v4 for the same upstream (issue 40): two
// teams, each with one project of protocol openai on the no-op model
// (which answers any POST), one team with 99 more projects that are never
// called. What the door adds per call must not grow with them: a
// request's model name is resolved from an index kept per team, not by
// listing the team's projects.

// openaiTeams are the teams of the step, by how many projects they have.
var openaiTeams = []struct {
	team     string
	projects int
}{{"oa1", 1}, {"oa100", 100}}

// openaiManifest is the manifest's part for the step: per team, its called
// project (id the team's name, always one replica) and the idle rest.
func openaiManifest(noop string) string {
	var b strings.Builder
	for _, t := range openaiTeams {
		fmt.Fprintf(&b, "  - {id: %[1]s, team: %[1]s, modelKey: mk-%[1]s, protocol: openai, healthPath: /healthz, command: [%[2]q], concurrency: 64, minReplicas: 1, maxReplicas: 1, bootTimeout: 30}\n", t.team, noop)
		for i := 1; i < t.projects; i++ {
			fmt.Fprintf(&b, "  - {id: %[1]s-%03[3]d, team: %[1]s, modelKey: mk-%[1]s-%03[3]d, protocol: openai, healthPath: /healthz, command: [%[2]q], minReplicas: 0, maxReplicas: 1, bootTimeout: 30}\n", t.team, noop, i)
		}
	}
	return b.String()
}

// openaiKeys creates a key for each team of the step.
func openaiKeys(o options, e *env) error {
	e.teamKeys = map[string]string{}
	for _, t := range openaiTeams {
		out, err := exec.Command(o.inferd, "--config", e.inferdCfg, "key", "create", "--team", t.team).Output()
		if err != nil {
			return fmt.Errorf("inferd key create --team %s: %w", t.team, err)
		}
		f := strings.Fields(strings.TrimSpace(string(out)))
		e.teamKeys[t.team] = f[len(f)-1]
	}
	return nil
}

// inferdAs is e.inferd with team's key.
func (e *env) inferdAs(name string, t loadgen.Target, team, model string, c int) runSpec {
	s := e.inferd(name, t, model, c)
	s.cfg.APIKey = e.teamKeys[team]
	return s
}

// measureOpenAIDoor compares inferd's CPU per call through the OpenAI
// door with /start/v4's, for the same project and no-op upstream, with 1
// and 100 projects in the team, at concurrency 16 (the middle load, where
// neither the model nor the cores are saturated).
func measureOpenAIDoor(ctx context.Context, e *env, o options, r *report) error {
	res, err := sideBySide(ctx, o, []runSpec{
		e.inferdAs("start, team of 1", loadgen.Start, "oa1", "mk-oa1", 16),
		e.inferdAs("openai, team of 1", loadgen.OpenAI, "oa1", "oa1", 16),
		e.inferdAs("start, team of 100", loadgen.Start, "oa100", "mk-oa100", 16),
		e.inferdAs("openai, team of 100", loadgen.OpenAI, "oa100", "oa100", 16),
	})
	if err != nil {
		return err
	}
	r.table("OpenAI door beside /start/v4, one project of protocol openai on the no-op model, concurrency 16", res,
		"start, team of 1", "start, team of 1",
		"start, team of 1", "openai, team of 1", "start, team of 100", "openai, team of 100")
	start1, oa1, oa100 := res["start, team of 1"], res["openai, team of 1"], res["openai, team of 100"]
	for _, m := range []*merged{start1, oa1, res["start, team of 100"], oa100} {
		r.add("inferd CPU per call (schedstat), "+m.name, dur(m.cpuPerCall()), "", true)
	}
	door := cpuRatio(oa1, start1)
	r.add("OpenAI door CPU per call ÷ /start/v4's, team of 1", fmt.Sprintf("%.2f×", door), "≤ 1.2×", door <= 1.2)
	flat := cpuRatio(oa100, oa1)
	r.add("OpenAI door CPU per call, team of 100 ÷ team of 1", fmt.Sprintf("%.2f×", flat), "≤ 1.2×", flat <= 1.2)
	return nil
}

// cpuRatio is a's CPU per call over b's.
func cpuRatio(a, b *merged) float64 {
	if b.cpuPerCall() <= 0 {
		return 0
	}
	return float64(a.cpuPerCall()) / float64(b.cpuPerCall())
}
