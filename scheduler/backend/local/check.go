package local

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"inferd/gpu"
	"inferd/pyenv"
	"inferd/scheduler/backend"
	"inferd/store"
)

// Checks before a model runs: apply and doctor ask what would keep a project's
// model from starting here, as this backend would start it (its dir, its
// program, the user it runs as, the GPUs it asks for), so that the operator
// hears of a missing dir at apply time rather than from a call that fails
// with "fork/exec …: no such file or directory".

// Finding is one thing found wrong with a model spec, with its fix.
type Finding struct {
	// Fatal says the model cannot start as it is (no such dir or program,
	// or one its user cannot read or run); otherwise it is a warning or a
	// hint (more GPUs than the machine has, a protocol that looks wrong).
	Fatal bool
	Text  string
}

// Checker checks model specs against this machine.
type Checker struct {
	// RunAs is who models run as; nil = this process's user. A RunAs
	// without a Name stands for a uid of the project's own (replica.user:
	// per-project): any such uid, since none owns a file or is in a group.
	RunAs   *RunAs
	Devices func() []gpu.Device // the machine's GPUs; nil = none
	// LookPath finds a program with no slash as Launch will (on this
	// process's PATH); nil = exec.LookPath.
	LookPath func(string) (string, error)
	// Protections are the sandbox's in force (Backend.Protections), for
	// warnings about a memoryMiB, pidsMax or private network a model asks
	// for and would not get; nil = not known, no such warning.
	Protections []backend.Protection
	// Parking says whether replicas can be parked here (ParkSupport), for
	// a warning about a parkTimeout that would do nothing; nil = not known.
	Parking func() error
}

// Checker returns the checker for the models this backend runs: its user,
// its GPUs, its sandbox.
func (b *Backend) Checker() *Checker {
	c := &Checker{RunAs: b.sb.checkRunAs(), Protections: b.Protections(), Parking: b.ParkSupport}
	if b.cfg.GPUs != nil {
		c.Devices = b.cfg.GPUs.Devices
	}
	return c
}

// ModelUser is who models run as under replica.user name, decided as New
// decides it, for checks made without a backend (apply with no daemon,
// doctor): nil = this process's own user (it cannot switch users, or name
// is root); for per-project, a RunAs that stands for any uid of the range
// (see Checker.RunAs).
func ModelUser(name string) (*RunAs, error) {
	priv := effectivePrivileges()
	switch {
	case !priv.switchUser || name == "root" || name == "0":
		return nil, nil
	case name == "" || name == PerProject:
		return &RunAs{UID: DefaultUIDFirst, GID: DefaultUIDFirst}, nil
	}
	return LookupRunAs(name)
}

// who names the model user in findings.
func (c *Checker) who() string {
	if c.RunAs != nil && c.RunAs.Name == "" {
		return "a uid of the project's own (replica.user: per-project)"
	}
	if c.RunAs != nil {
		return "user " + c.RunAs.Name
	}
	if u, err := user.Current(); err == nil {
		return "user " + u.Username
	}
	return fmt.Sprintf("uid %d", os.Geteuid())
}

// Check returns what would keep m from starting (Fatal) or working as meant,
// one finding per problem, each with what to do; none when all is well.
func (c *Checker) Check(m store.ModelSpec) []Finding {
	var out []Finding
	fail := func(format string, a ...any) {
		out = append(out, Finding{Fatal: true, Text: fmt.Sprintf(format, a...)})
	}
	warn := func(format string, a ...any) { out = append(out, Finding{Text: fmt.Sprintf(format, a...)}) }

	dirOK := true
	if m.Dir != "" {
		fi, err := os.Stat(m.Dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			fail("dir %s does not exist: create it, or fix dir in the manifest", m.Dir)
			dirOK = false
		case err != nil:
			fail("dir %s: %v", m.Dir, err)
			dirOK = false
		case !fi.IsDir():
			fail("dir %s is not a directory: fix dir in the manifest", m.Dir)
			dirOK = false
		default:
			switch b := c.blocker(m.Dir, 0o5); {
			case b == "":
			case b == filepath.Clean(m.Dir):
				fail("dir %s is not readable by %s, who runs the model: chmod o+rx it, or set replica.user", m.Dir, c.who())
				dirOK = false
			default:
				fail("dir %s is not readable by %s, who runs the model: %s. Move the model out of %s, "+
					"chmod o+x %s, or set replica.user (root, or a user who can read it; docs/security.md)",
					m.Dir, c.who(), blockedBy(b), b, b)
				dirOK = false
			}
		}
	}
	// A program in an image is the image's to have: only its start says.
	// So is a bare name with a Python environment, whose bin comes first
	// (python3, a console script), built only at the first boot.
	venvProgram := m.Python.On() && len(m.Command) > 0 && !strings.Contains(m.Command[0], "/")
	if m.Image == "" && !venvProgram && len(m.Command) > 0 && m.Command[0] != "" {
		c.checkProgram(m, dirOK, fail)
	}
	checkPython(m.Python, fail)
	c.checkGPUs(m, warn)
	c.checkParking(m, warn)
	checkProtocol(m, dirOK, warn)
	c.checkSandbox(m, warn)
	return out
}

// checkPython fails a Python environment whose files are not there: the
// requirements file, the wheelhouse, the interpreter.
func checkPython(py store.PythonSpec, fail func(string, ...any)) {
	if !py.On() {
		return
	}
	interp := py.Interpreter
	if interp == "" {
		interp = pyenv.DefaultInterpreter
	}
	for _, f := range []struct {
		field, path string
		dir         bool
	}{{"python.requirements", py.Requirements, false}, {"python.wheelhouse", py.Wheelhouse, true}, {"python.interpreter", interp, false}} {
		if f.path == "" {
			continue
		}
		fi, err := os.Stat(f.path)
		switch {
		case err != nil:
			fail("%s %s: %v: fix it in the manifest", f.field, f.path, errBrief(err))
		case fi.IsDir() != f.dir:
			fail("%s %s is %s: fix it in the manifest", f.field, f.path, map[bool]string{true: "a directory", false: "not a directory"}[fi.IsDir()])
		}
	}
}

// checkSandbox warns when m asks for a memoryMiB, a pidsMax or a private
// network that this daemon's sandbox cannot give, and says why.
func (c *Checker) checkSandbox(m store.ModelSpec, warn func(string, ...any)) {
	off := map[string]string{}
	for _, p := range c.Protections {
		if !p.On {
			off[p.Name] = p.Detail
		}
	}
	if why, ok := off[backend.ProtectionMemoryLimit]; ok && m.MemoryMiB > 0 {
		warn("memoryMiB: %d is not enforced here (%s)", m.MemoryMiB, why)
	}
	if why, ok := off[backend.ProtectionPidsLimit]; ok && m.PidsMax > 0 {
		warn("pidsMax: %d is not enforced here (%s)", m.PidsMax, why)
	}
	if why, ok := off[backend.ProtectionNetwork]; ok && m.Network == store.NetworkPrivate {
		warn("network: private is not possible here: its replicas share the host's network (%s)", why)
	}
}

// checkProgram checks that the command's program exists and that the model
// user may run it, and that a script it names in dir is there.
func (c *Checker) checkProgram(m store.ModelSpec, dirOK bool, fail func(string, ...any)) {
	prog := m.Command[0]
	path := prog
	switch {
	case !strings.Contains(prog, "/"):
		look := c.LookPath
		if look == nil {
			look = exec.LookPath
		}
		found, err := look(prog)
		if err != nil {
			fail("command %s is not on the PATH models get (%s): install it, or give its full path in command", prog, os.Getenv("PATH"))
			return
		}
		path = found
	case !filepath.IsAbs(prog):
		if !dirOK {
			return
		}
		path = filepath.Join(m.Dir, prog)
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		fail("command %s does not exist: fix command in the manifest", path)
		return
	case err != nil:
		fail("command %s: %v", path, err)
		return
	case fi.IsDir():
		fail("command %s is a directory: name the program in command", path)
		return
	}
	switch b := c.blocker(path, 0o1); {
	case b == "":
	case b == filepath.Clean(path) || !filepath.IsAbs(path):
		fail("command %s is not executable by %s, who runs the model: chmod o+rx it, or set replica.user", path, c.who())
		return
	default:
		fail("command %s is not executable by %s, who runs the model: %s. Name a program outside it in command%s, "+
			"or set replica.user (root, or a user who can run it; docs/security.md)",
			path, c.who(), blockedBy(b), systemProgram(prog))
		return
	}
	// python3 server.py: the script is read from dir.
	if !dirOK {
		return
	}
	for _, arg := range m.Command[1:] {
		if !isScript(arg) {
			continue
		}
		script := arg
		if !filepath.IsAbs(script) {
			script = filepath.Join(m.Dir, arg)
		}
		switch _, err := os.Stat(script); {
		case errors.Is(err, os.ErrNotExist):
			fail("command %s: %s does not exist: fix command or dir in the manifest", strings.Join(m.Command, " "), script)
		case err == nil && !c.may(script, 0o4):
			fail("command %s: %s is not readable by %s, who runs the model: chmod o+r it, or set replica.user", strings.Join(m.Command, " "), script, c.who())
		}
		return
	}
}

// systemProgram suggests the system's copy of a program that a user's own
// installation shadows (a pyenv's python3 under /root): " (/usr/bin/python3)",
// or "" when the system has none.
func systemProgram(prog string) string {
	for _, dir := range []string{"/usr/bin", "/usr/local/bin", "/bin"} {
		p := filepath.Join(dir, filepath.Base(prog))
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode().Perm()&0o001 != 0 {
			return fmt.Sprintf(" (the system's %s: command: [%q, …])", p, p)
		}
	}
	return ""
}

// isScript reports whether a command argument names a script file: a word
// with a script's extension, not an option nor a shell command line
// (sh -c "…; exec python3 server.py").
func isScript(arg string) bool {
	return !strings.HasPrefix(arg, "-") && !strings.ContainsAny(arg, " \t\n;&|$`'\"") &&
		slices.Contains([]string{".py", ".sh", ".js", ".rb", ".pl"}, filepath.Ext(arg))
}

// checkGPUs warns when m asks for more GPUs, or more memory on one, than the
// machine has: its calls would fail with "project needs …".
func (c *Checker) checkGPUs(m store.ModelSpec, warn func(string, ...any)) {
	need := m.GPUDemand()
	if need.GPUs == 0 {
		return
	}
	var devs []gpu.Device
	if c.Devices != nil {
		devs = c.Devices()
	}
	if need.GPUs > len(devs) {
		warn("gpus: %d per replica, but this machine has %d GPU(s): its calls will fail until it has them (lower gpus; see doctor for the driver)", need.GPUs, len(devs))
		return
	}
	if need.MemoryMiB > 0 {
		fit := 0
		var largest uint64
		for _, d := range devs {
			largest = max(largest, d.MemoryTotalMiB)
			if d.MemoryTotalMiB >= uint64(need.MemoryMiB) {
				fit++
			}
		}
		if fit < need.GPUs {
			warn("gpuMemoryMiB: %d per GPU, but %d of this machine's GPUs have that much (the largest has %d MiB): its calls will fail (lower gpuMemoryMiB)", need.MemoryMiB, fit, largest)
		}
	}
}

// checkParking warns when m's parkTimeout would park nothing: a CPU model,
// or a box whose driver cannot (see Backend.ParkSupport).
func (c *Checker) checkParking(m store.ModelSpec, warn func(string, ...any)) {
	switch {
	case m.ParkTimeout <= 0:
	case m.GPUDemand().GPUs == 0:
		warn("parkTimeout: %d does nothing for a CPU model: only GPU replicas park (set gpus or gpuMemoryMiB, or leave parkTimeout out)", m.ParkTimeout)
	case c.Parking != nil:
		if err := c.Parking(); err != nil {
			warn("parkTimeout: %d, but replicas cannot be parked here (%v): its idle replicas stay warm until idleTimeout (docs/gpu.md, Parking)", m.ParkTimeout, err)
		}
	}
}

// scriptPeekBytes is how much of a model's script the protocol hints read.
const scriptPeekBytes = 64 << 10

// checkProtocol gives hints for a protocol that does not look like the
// model's: a Potassium app run as protocol http (inferd would wait for
// /healthz on $PORT, while the app serves /__status__ on 8000), and the
// reverse.
func checkProtocol(m store.ModelSpec, dirOK bool, warn func(string, ...any)) {
	m = m.WithDefaults()
	if !dirOK || len(m.Command) < 2 {
		return
	}
	var script string
	for _, arg := range m.Command[1:] {
		if isScript(arg) && filepath.Ext(arg) == ".py" {
			script = arg
			break
		}
	}
	if script == "" {
		return
	}
	if !filepath.IsAbs(script) {
		script = filepath.Join(m.Dir, script)
	}
	f, err := os.Open(script)
	if err != nil {
		return
	}
	defer f.Close()
	head, _ := io.ReadAll(io.LimitReader(f, scriptPeekBytes))
	potassium := bytes.Contains(head, []byte("from potassium import")) || bytes.Contains(head, []byte("import potassium"))
	switch {
	case potassium && m.Protocol != store.ProtocolPotassium:
		warn("protocol: %s, but %s imports potassium: set protocol: potassium (a Potassium app listens on 8000 and answers /__status__)", m.Protocol, script)
	case !potassium && m.Protocol == store.ProtocolPotassium:
		warn("protocol: potassium, but %s does not import potassium: a model that serves its own HTTP needs protocol: http, listening on $PORT", script)
	}
}

// may reports whether the model user may access path as want asks (0o4
// read, 0o1 execute or search, or both), searching every directory above
// it. For this process's own user the kernel answers (access(2)); for
// another user the mode bits are read (ACLs are not).
func (c *Checker) may(path string, want uint32) bool { return c.blocker(path, want) == "" }

// blocker returns what keeps the model user from path with want access:
// the directory above it, nearest the root, that it may not pass through
// (/root, mode 0700, for a pyenv under it), or path itself; "" when
// nothing does.
func (c *Checker) blocker(path string, want uint32) string {
	if c.RunAs == nil {
		if syscall.Access(path, want) == nil {
			return ""
		}
		return path
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	var dirs []string
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		dirs = append(dirs, dir)
		if dir == "/" {
			break
		}
	}
	for _, dir := range slices.Backward(dirs) {
		if !permits(dir, c.RunAs, 0o1) {
			return dir
		}
	}
	if !permits(abs, c.RunAs, want) {
		return abs
	}
	return ""
}

// blockedBy says why the model user cannot reach path when blocker (from
// c.blocker) is a directory above it: which one, its mode, and the fixes.
func blockedBy(blocker string) string {
	mode := ""
	if fi, err := os.Stat(blocker); err == nil {
		mode = fmt.Sprintf(" (mode %04o)", fi.Mode().Perm())
	}
	return fmt.Sprintf("%s%s lets no other user through", blocker, mode)
}

// permits reports whether u's mode bits on path allow want.
func permits(path string, u *RunAs, want uint32) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	perm := uint32(fi.Mode().Perm())
	switch {
	case st.Uid == u.UID:
		return perm>>6&want == want
	case st.Gid == u.GID || slices.Contains(u.Groups, st.Gid):
		return perm>>3&want == want
	default:
		return perm&want == want
	}
}

// Problems is Check split by kind (see SplitFindings).
func (c *Checker) Problems(m store.ModelSpec) (fatal, warnings []string) {
	return SplitFindings(c.Check(m))
}

// SplitFindings splits findings into what keeps a model from starting and
// the warnings and hints.
func SplitFindings(fs []Finding) (fatal, warnings []string) {
	for _, f := range fs {
		if f.Fatal {
			fatal = append(fatal, f.Text)
		} else {
			warnings = append(warnings, f.Text)
		}
	}
	return fatal, warnings
}
