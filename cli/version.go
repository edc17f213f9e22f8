package cli

import (
	"context"
	"fmt"
	"runtime/debug"
)

// versionCommand prints the version, commit, build date and Go version.
type versionCommand struct {
	env   *env
	build Build
}

func (c *versionCommand) Usage() string {
	return `Usage:
  inferd version
  inferd --version

Prints inferd's version, the commit it was built from, the build date and the
Go version. A plain 'go build' in a checkout reports the commit and commit
time Go recorded from version control ("+dirty" when the tree had changes).
`
}

func (c *versionCommand) Run(_ context.Context, args []string) error {
	if err := parseFlagsOnly(subFlags("version"), args); err != nil {
		return err
	}
	rev, built := c.buildInfo()
	fmt.Fprintf(c.env.stdout, "inferd %s (commit %s, built %s, %s)\n", c.build.Version, rev, built, goVersion())
	return nil
}

func goVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "unknown"
}

// buildInfo returns the commit and build date set with -ldflags (make build,
// make package) or, for a plain `go build` in a checkout, the commit and
// commit time Go recorded from version control ("+dirty" when the tree had
// changes).
func (c *versionCommand) buildInfo() (rev, built string) {
	rev, built = c.build.Commit, c.build.Date
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return rev, built
	}
	vcs := map[string]string{}
	for _, s := range bi.Settings {
		vcs[s.Key] = s.Value
	}
	if rev == "unknown" && vcs["vcs.revision"] != "" {
		rev = vcs["vcs.revision"]
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if vcs["vcs.modified"] == "true" {
			rev += "+dirty"
		}
	}
	if built == "unknown" && vcs["vcs.time"] != "" {
		built = vcs["vcs.time"] + " (commit time)"
	}
	return rev, built
}
