package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"inferd/gpu/cudackpt"
)

// cudaCheckpointCommand is the CUDA driver's checkpoint API for other
// processes, as the daemon uses it to park idle GPU replicas: the daemon
// runs this command in a process of its own (scheduler/backend/local,
// parking.go), so that the driver is never loaded into the daemon. An
// operator may run it too, to see what parking would do to a process.
type cudaCheckpointCommand struct {
	env *env
}

func (c *cudaCheckpointCommand) Usage() string {
	return `Usage:
  inferd cuda-checkpoint check
  inferd cuda-checkpoint state PID...
  inferd cuda-checkpoint park [--timeout-ms N] [--gpu-pids PID,...] PID...
  inferd cuda-checkpoint restore PID...

The CUDA driver's checkpoint API (driver 570 or later) for other processes,
as inferd parks idle GPU replicas with it (docs/gpu.md "Parking"). Run it as
root or as the processes' user.

  check    whether this box has the API; exit status 1 and the reason if not
  state    each process's checkpoint state: running, locked, checkpointed,
           failed, or what the driver answered for a process without CUDA
  park     lock every CUDA process among PIDs (waiting up to --timeout-ms,
           default 10000, for calls in flight), then move each one's GPU
           memory into its host memory and release the GPU; a process the
           driver knows nothing of is skipped, unless --gpu-pids names it (a
           process NVML lists on a GPU must be checkpointed). On a failure
           what was done is undone.
  restore  bring the GPU state of each of PIDs back and unlock it

park and restore print one JSON object, {"checkpointed": [PID...],
"skipped": {PID: reason}} or {"error": "...", "unsupported": true|false}, and
exit with status 1 on an error.
`
}

func (c *cudaCheckpointCommand) Run(_ context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: cuda-checkpoint needs check, state, park or restore", errUsage)
	}
	action, rest := args[0], args[1:]
	fs := subFlags("cuda-checkpoint " + action)
	timeoutMs := fs.Uint("timeout-ms", 10000, "")
	gpuPids := fs.String("gpu-pids", "", "")
	words, err := parseSub(fs, rest)
	if err != nil {
		return err
	}
	pids, err := parsePids(words)
	if err != nil {
		return err
	}
	must, err := parsePids(strings.FieldsFunc(*gpuPids, func(r rune) bool { return r == ',' }))
	if err != nil {
		return err
	}
	switch {
	case action == "check" && len(pids) == 0:
		d, err := cudackpt.Open()
		if err != nil {
			return err
		}
		fmt.Fprintf(c.env.stdout, "the CUDA driver (CUDA %s) has the checkpoint API\n", d.VersionString())
		return nil
	case action == "check":
		return fmt.Errorf("%w: cuda-checkpoint check takes no PIDs", errUsage)
	case len(pids) == 0:
		return fmt.Errorf("%w: cuda-checkpoint %s needs PIDs", errUsage, action)
	}
	d, err := cudackpt.Open()
	switch action {
	case "state":
		if err != nil {
			return err
		}
		for _, pid := range pids {
			st, err := d.State(pid)
			answer := st.String()
			if err != nil {
				answer = err.Error()
			}
			fmt.Fprintf(c.env.stdout, "%d %s\n", pid, answer)
		}
		return nil
	case "park":
		var res cudackpt.ParkResult
		if err == nil {
			res, err = cudackpt.Park(d, pids, must, uint32(*timeoutMs))
		}
		return c.answer(res, err)
	case "restore":
		if err == nil {
			err = cudackpt.Restore(d, pids)
		}
		return c.answer(cudackpt.ParkResult{Checkpointed: pids}, err)
	}
	return fmt.Errorf("%w: unknown cuda-checkpoint action %q (check, state, park or restore)", errUsage, action)
}

// answer prints park's or restore's JSON answer; an error also fails the
// command (exit status 1) with nothing more printed.
func (c *cudaCheckpointCommand) answer(res cudackpt.ParkResult, err error) error {
	var out any = res
	if err != nil {
		out = helperFailure{Error: err.Error(), Unsupported: cudackpt.Unsupported(err)}
	}
	if jerr := json.NewEncoder(c.env.stdout).Encode(out); jerr != nil {
		return jerr
	}
	if err != nil {
		return errReported
	}
	return nil
}

// helperFailure is park's or restore's answer on an error.
type helperFailure struct {
	Error       string `json:"error"`
	Unsupported bool   `json:"unsupported"`
}

// errReported fails a command whose output already said why.
var errReported = errors.New("failed (see the output)")

func parsePids(words []string) ([]int, error) {
	var pids []int
	for _, w := range words {
		pid, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("%w: %q is not a process id", errUsage, w)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
