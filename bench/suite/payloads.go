package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"inferd/bench/payload"
)

// The large-payload figures of issue 16, measured as e2e/payloads_test.go
// measures them (bench/payload): 100 queued calls of 5 MiB inputs, then 32
// concurrent checks of a 5 MiB result, each phase's peak RSS on its own
// (VmHWM reset before it), and the checks' CPU time per MB beside an io.Copy
// of the same bytes over loopback.
const (
	payloadSize    = 5 << 20
	payloadCalls   = 100
	payloadClients = 32
	payloadRounds  = 4
)

func measurePayloads(ctx context.Context, e *env, o options, r *report) error {
	pid := e.inferdPid
	if err := payload.ResetPeak(pid); err != nil {
		return err
	}
	q := &payload.Client{Base: e.base, APIKey: e.apiKey, ModelKey: "mk-bigq"}
	ids, pending, err := q.Queue(ctx, "", payloadCalls, payloadSize, 4)
	if err != nil {
		return err
	}
	queued, err := payload.Peak(pid)
	if err != nil {
		return err
	}
	if err := os.WriteFile(e.gate, nil, 0o644); err != nil {
		return err
	}
	if err := q.Wait(ctx, ids); err != nil {
		return err
	}
	ran, err := payload.Peak(pid)
	if err != nil {
		return err
	}
	const queueLimit = 200 << 20
	r.add(fmt.Sprintf("Peak RSS, %d calls of 5 MiB inputs queued (%d answered pending) / then run", payloadCalls, pending),
		payload.MiB(queued)+" / "+payload.MiB(ran), "≤ 200 MiB", ran <= queueLimit)

	c := &payload.Client{Base: e.base, APIKey: e.apiKey, ModelKey: "mk-bigr"}
	a, err := c.Start(ctx, []byte(`{}`), false)
	if err != nil {
		return err
	}
	if a.Message != "success" {
		return fmt.Errorf("start of the large result: %s", a.Message)
	}
	if err := payload.ResetPeak(pid); err != nil {
		return err
	}
	cpu0, err := payload.CPU(pid)
	if err != nil {
		return err
	}
	n, err := c.Checks(ctx, a.CallID, payloadClients, payloadRounds, payloadSize)
	if err != nil {
		return err
	}
	cpu1, err := payload.CPU(pid)
	if err != nil {
		return err
	}
	peak, err := payload.Peak(pid)
	if err != nil {
		return err
	}
	const checkLimit = 100<<20 + payloadClients*payloadSize*3/2
	r.add(fmt.Sprintf("Peak RSS, %d concurrent checks × %d of a 5 MiB result", payloadClients, payloadRounds),
		payload.MiB(peak), "≤ 340 MiB", peak <= checkLimit)

	self, err := os.Executable()
	if err != nil {
		return err
	}
	base, err := payload.CopyBaseline(exec.CommandContext(ctx, self, "-copy-server", strconv.Itoa(payloadSize)),
		payloadClients, payloadRounds, payloadSize)
	if err != nil {
		return err
	}
	check := payload.PerMB(cpu1-cpu0, n)
	ratio := float64(check) / float64(base)
	r.add("CPU per MB, large check / io.Copy over loopback", fmt.Sprintf("%s / %s (%.1f×)", dur(check), dur(base), ratio), "≤ 3×", ratio <= 3)
	return nil
}
