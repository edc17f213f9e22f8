package local

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"inferd/scheduler/backend"
	"inferd/store"
)

// ApplyWarnings says what the sandbox cannot do for projects as they ask
// (see accessWarnings and limitWarnings). apply shows these as warnings;
// they reject nothing.
func (b *Backend) ApplyWarnings(projects []store.Project) []string {
	return append(b.accessWarnings(projects), b.limitWarnings(projects)...)
}

// limitWarnings names the projects that ask for a memoryMiB, a pidsMax or a
// private network that this daemon cannot give them, and why.
func (b *Backend) limitWarnings(projects []store.Project) []string {
	var out []string
	ps := b.Protections()
	why := func(name string) (string, bool) {
		for _, p := range ps {
			if p.Name == name {
				return p.Detail, p.On
			}
		}
		return "", false
	}
	for _, p := range projects {
		m := p.Model
		if d, on := why(backend.ProtectionMemoryLimit); m.MemoryMiB > 0 && !on {
			out = append(out, fmt.Sprintf("project %s: memoryMiB %d is not enforced here (%s)", p.ID, m.MemoryMiB, d))
		}
		if d, on := why(backend.ProtectionPidsLimit); m.PidsMax > 0 && !on {
			out = append(out, fmt.Sprintf("project %s: pidsMax %d is not enforced here (%s)", p.ID, m.PidsMax, d))
		}
		if m.Network == store.NetworkPrivate && b.sb.netnsErr != nil {
			out = append(out, fmt.Sprintf("project %s: network private is not possible here: its replicas share the host's network (%v)", p.ID, errBrief(b.sb.netnsErr)))
		}
	}
	return out
}

// accessWarnings says, for each project whose replicas run as a user other
// than the daemon's, what that user could not reach to start its model:
// the model's dir (it must be able to enter and list it) or its program (it
// must be able to run it). A uid of the project's own owns no file and is in
// no group, so "others" permission bits are what count for it. Nothing is
// said when models run as the daemon's own user.
func (b *Backend) accessWarnings(projects []store.Project) []string {
	var out []string
	for _, p := range projects {
		who, u := b.accessUser(p)
		if u == nil {
			continue
		}
		m := p.Model
		if m.Dir != "" {
			if why := reach(m.Dir, u, 0o5); why != "" {
				out = append(out, fmt.Sprintf("project %s: its replicas run as %s, which cannot read its dir %s (%s): make it readable by others (chmod o+rx), or see replica.user", p.ID, who, m.Dir, why))
			}
		}
		if len(m.Command) == 0 {
			continue
		}
		prog := m.Command[0]
		if !strings.Contains(prog, "/") {
			// Resolved on the daemon's PATH, as Launch resolves it.
			path, err := exec.LookPath(prog)
			if err != nil {
				out = append(out, fmt.Sprintf("project %s: its program %s is not on the daemon's PATH", p.ID, prog))
				continue
			}
			prog = path
		} else if !filepath.IsAbs(prog) {
			prog = filepath.Join(m.Dir, prog)
		}
		if why := reach(prog, u, 0o1); why != "" {
			out = append(out, fmt.Sprintf("project %s: its replicas run as %s, which cannot run its program %s (%s): make it readable and executable by others, or see replica.user", p.ID, who, prog, why))
		}
	}
	return out
}

// accessUser is who p's replicas run as, for accessWarnings; nil = the
// daemon's own user or root, whom nothing is checked for.
func (b *Backend) accessUser(p store.Project) (string, *RunAs) {
	switch b.sb.identity {
	case identityNamed:
		return "user " + b.sb.named.Name, b.sb.named
	case identityPerProject:
		// Its uid owns nothing and is in no group: any uid of the range
		// stands for it, so no uid is assigned just to check.
		uid := b.sb.uids.first
		return "a uid of their own (replica.user: per-project)", &RunAs{UID: uid, GID: uid}
	}
	return "", nil
}

// reach says why u could not get mode (bits of 0o7: 4 read, 1 execute or
// search) on path, or "" when it could: every directory on the way must let
// it search, and path itself give it mode.
func reach(path string, u *RunAs, mode os.FileMode) string {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return errBrief(err).Error()
	}
	dirs := []string{}
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		dirs = append(dirs, d)
		if d == "/" || d == "." {
			break
		}
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		if !permits(d, u, 0o1) {
			return d + " is not searchable by others"
		}
	}
	if !permits(real, u, mode) {
		what := map[os.FileMode]string{0o1: "executable", 0o5: "readable"}[mode]
		if what == "" {
			what = "usable"
		}
		return fmt.Sprintf("%s is not %s by others", real, what)
	}
	return ""
}

// permits reports whether u gets mode on the file at path from its
// permission bits (ACLs are not read).
func permits(path string, u *RunAs, mode os.FileMode) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	perm := fi.Mode().Perm()
	var bits os.FileMode
	switch {
	case st.Uid == u.UID:
		bits = perm >> 6
	case st.Gid == u.GID || slices.Contains(u.Groups, st.Gid):
		bits = perm >> 3
	default:
		bits = perm
	}
	return bits&mode == mode
}
