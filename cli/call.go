package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
)

// callCommand calls a model from the shell, or cancels a call.
type callCommand struct{ env *env }

func (c *callCommand) Usage() string {
	return `Usage:
  inferd [global flags] call PROJECT INPUTS [--stream]
  inferd [global flags] call cancel CALLID

call PROJECT INPUTS calls the project's model with INPUTS, a JSON value such
as '{"prompt": "hi"}', or - to read them from stdin, and prints its outputs,
one JSON value a line, as /start/v4's modelOutputs has them. The call is a
durable call like any other: it queues, boots a replica if none runs, and
shows on the status page. It needs the daemon running (in a cluster, the
call runs on the node its project is placed on). A call that fails prints its error
message and exits with status 1; Ctrl-C cancels the call.
  --stream   print each line the model streams as it streams it (a model
             that does not stream prints its reply at the end)

call cancel CALLID ends a call that has not finished: a queued call never
reaches its model, a running call's request to the model is aborted. Every
later check of the call answers "error: cancelled by request". A finished
call is left as it is (exit status 1). Works whether or not the daemon runs.
(A project named cancel is called as any other: call cancel INPUTS, where
INPUTS is no call ID.)
`
}

func (c *callCommand) Run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "cancel" && (len(args) != 2 || strings.HasPrefix(args[1], "call_")) {
		return c.cancel(ctx, args[1:])
	}
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			return flag.ErrHelp
		}
	}
	return c.call(ctx, args)
}

// callLine is one line of the admin API's call answer (httpapi's
// adminCallLine).
type callLine struct {
	Output  json.RawMessage   `json:"output"`
	CallID  string            `json:"callID"`
	State   string            `json:"state"`
	Message string            `json:"message"`
	Outputs []json.RawMessage `json:"outputs"`
}

func (c *callCommand) call(ctx context.Context, args []string) error {
	fs := subFlags("call")
	stream := fs.Bool("stream", false, "print each streamed line as it comes")
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("%w: call needs PROJECT and INPUTS (a JSON value such as '{\"prompt\": \"hi\"}', or - to read them from stdin)", errUsage)
	}
	inputs := []byte(pos[1])
	if pos[1] == "-" {
		if c.env.stdin == nil {
			return fmt.Errorf("%w: no stdin to read the inputs from", errUsage)
		}
		if inputs, err = io.ReadAll(c.env.stdin); err != nil {
			return fmt.Errorf("read the inputs from stdin: %w", err)
		}
	}
	if !json.Valid(bytes.TrimSpace(inputs)) {
		return fmt.Errorf("%w: INPUTS is not valid JSON: %.100q", errUsage, inputs)
	}
	path := "/admin/projects/" + url.PathEscape(pos[0]) + "/call"
	if *stream {
		path += "?stream=1"
	}
	cfg, err := c.env.dataConfig()
	if err != nil {
		return err
	}
	if !daemonAnswers(cfg) {
		return fmt.Errorf("no inferd daemon serves %s: call needs one running (make run, or inferd serve)", cfg.DataDir)
	}
	return c.env.withAdmin(func(a *adminClient) error {
		resp, err := a.do(ctx, "POST", path, bytes.NewReader(inputs))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		out := bufio.NewWriter(c.env.stdout)
		defer out.Flush()
		rd := bufio.NewReader(resp.Body)
		printed := 0
		for {
			raw, err := rd.ReadBytes('\n')
			if len(bytes.TrimSpace(raw)) > 0 {
				var l callLine
				if jerr := json.Unmarshal(raw, &l); jerr != nil {
					return fmt.Errorf("admin API: decode reply: %w", jerr)
				}
				if l.CallID == "" {
					fmt.Fprintf(out, "%s\n", l.Output)
					printed++
					out.Flush()
					continue
				}
				if l.State != "succeeded" {
					return fmt.Errorf("call %s: %s", l.CallID, l.Message)
				}
				if printed == 0 {
					for _, o := range l.Outputs {
						fmt.Fprintf(out, "%s\n", o)
					}
				}
				return nil
			}
			if errors.Is(err, io.EOF) {
				return errors.New("admin API: the answer ended before the call did (did the daemon stop?)")
			}
			if err != nil {
				return fmt.Errorf("admin API: read reply: %w", err)
			}
		}
	})
}

func (c *callCommand) cancel(ctx context.Context, args []string) error {
	fs := subFlags("call cancel")
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: call cancel needs one CALLID", errUsage)
	}
	var out struct {
		ID      string `json:"id"`
		Project string `json:"projectId"`
		Message string `json:"message"`
	}
	err = c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "POST", "/admin/calls/"+url.PathEscape(pos[0])+"/cancel", nil, &out)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "Cancelled call %s of project %s.\n", out.ID, out.Project)
	return nil
}
