package local

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"inferd/gpu"
	"inferd/store"
)

func TestCheckerNamesWhatKeepsAModelFromStarting(t *testing.T) {
	root := t.TempDir()
	// t.TempDir's directories are private to the test's user; the model's
	// must be open to a stranger as far as the test decides.
	for d := root; d != filepath.Dir(d) && strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(root, "model")
	write := func(name, text string, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write("server.py", "import http.server\n", 0o644)
	write("app.py", "from potassium import Potassium\napp = Potassium('x')\n", 0o644)
	notExec := write("run", "#!/bin/sh\n", 0o644)
	private := filepath.Join(root, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	file := write("notadir", "", 0o644)
	// A program and a model open to all, under a directory that is not (a
	// pyenv's python3 under /root, mode 0700).
	hidden := filepath.Join(private, "shims")
	if err := os.MkdirAll(filepath.Join(hidden, "model"), 0o755); err != nil {
		t.Fatal(err)
	}
	hiddenPython := filepath.Join(hidden, "python3")
	if err := os.WriteFile(hiddenPython, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	system := ""
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		system = ` (the system's /usr/bin/python3: command: ["/usr/bin/python3", …])`
	}
	// A user who is neither the files' owner nor in their group: only the
	// "other" bits count for it.
	stranger := &RunAs{Name: "stranger", UID: 4000000, GID: 4000000}
	oneGPU := func() []gpu.Device { return []gpu.Device{{Index: 0, UUID: "GPU-0", MemoryTotalMiB: 16000}} }
	lookPath := func(p string) (string, error) {
		if p == "python3" || p == "sh" {
			return "/bin/sh", nil // exists and is executable by everyone
		}
		return "", errors.New("not found")
	}

	for _, tc := range []struct {
		name  string
		m     store.ModelSpec
		runAs *RunAs
		want  string // the one finding, "" for none
		fatal bool
	}{
		{"all well", store.ModelSpec{Command: []string{"python3", "server.py"}, Dir: dir}, nil, "", false},
		{"a shell command line is not a script", store.ModelSpec{Command: []string{"sh", "-c", "printf hi; exec python3 gone.py"}, Dir: dir}, nil, "", false},
		{"all well for another user", store.ModelSpec{Command: []string{"python3", "server.py"}, Dir: dir}, stranger, "", false},
		{"dir missing", store.ModelSpec{Command: []string{"python3", "server.py"}, Dir: filepath.Join(root, "nope")},
			nil, "dir " + filepath.Join(root, "nope") + " does not exist: create it, or fix dir in the manifest", true},
		{"dir is a file", store.ModelSpec{Command: []string{"python3", "server.py"}, Dir: file},
			nil, "dir " + file + " is not a directory: fix dir in the manifest", true},
		{"dir unreadable by the model user", store.ModelSpec{Command: []string{"python3", "server.py"}, Dir: private},
			stranger, "dir " + private + " is not readable by user stranger, who runs the model: chmod o+rx it, or set replica.user", true},
		{"dir under a directory the model user cannot pass", store.ModelSpec{Command: []string{"/bin/sh"}, Dir: filepath.Join(hidden, "model")},
			stranger, "dir " + filepath.Join(hidden, "model") + " is not readable by user stranger, who runs the model: " + private +
				" (mode 0700) lets no other user through. Move the model out of " + private + ", chmod o+x " + private +
				", or set replica.user (root, or a user who can read it; docs/security.md)", true},
		{"program under a directory the model user cannot pass", store.ModelSpec{Command: []string{hiddenPython, "server.py"}, Dir: dir},
			stranger, "command " + hiddenPython + " is not executable by user stranger, who runs the model: " + private +
				" (mode 0700) lets no other user through. Name a program outside it in command" + system +
				", or set replica.user (root, or a user who can run it; docs/security.md)", true},
		{"program not on PATH", store.ModelSpec{Command: []string{"python4", "server.py"}, Dir: dir},
			nil, "command python4 is not on the PATH models get (" + os.Getenv("PATH") + "): install it, or give its full path in command", true},
		{"program path missing", store.ModelSpec{Command: []string{"./serve"}, Dir: dir},
			nil, "command " + filepath.Join(dir, "serve") + " does not exist: fix command in the manifest", true},
		{"program not executable", store.ModelSpec{Command: []string{notExec}, Dir: dir},
			stranger, "command " + notExec + " is not executable by user stranger, who runs the model: chmod o+rx it, or set replica.user", true},
		{"script missing from dir", store.ModelSpec{Command: []string{"python3", "serve.py"}, Dir: dir},
			nil, "command python3 serve.py: " + filepath.Join(dir, "serve.py") + " does not exist: fix command or dir in the manifest", true},
		{"more GPUs than the machine has", store.ModelSpec{Command: []string{"python3", "server.py"}, Dir: dir, GPUs: 2},
			nil, "gpus: 2 per replica, but this machine has 1 GPU(s): its calls will fail until it has them (lower gpus; see doctor for the driver)", false},
		{"more GPU memory than a GPU has", store.ModelSpec{Command: []string{"python3", "server.py"}, Dir: dir, GPUs: 1, GPUMemoryMiB: 40000},
			nil, "gpuMemoryMiB: 40000 per GPU, but 0 of this machine's GPUs have that much (the largest has 16000 MiB): its calls will fail (lower gpuMemoryMiB)", false},
		{"potassium app as http", store.ModelSpec{Command: []string{"python3", "app.py"}, Dir: dir},
			nil, "protocol: http, but " + filepath.Join(dir, "app.py") + " imports potassium: set protocol: potassium (a Potassium app listens on 8000 and answers /__status__)", false},
		{"http server as potassium", store.ModelSpec{Command: []string{"python3", "server.py"}, Dir: dir, Protocol: store.ProtocolPotassium},
			nil, "protocol: potassium, but " + filepath.Join(dir, "server.py") + " does not import potassium: a model that serves its own HTTP needs protocol: http, listening on $PORT", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Checker{RunAs: tc.runAs, Devices: oneGPU, LookPath: lookPath}
			got := c.Check(tc.m)
			if tc.want == "" {
				if len(got) != 0 {
					t.Fatalf("findings %+v, want none", got)
				}
				return
			}
			if len(got) != 1 || got[0].Text != tc.want || got[0].Fatal != tc.fatal {
				t.Fatalf("findings %+v\nwant one: %q (fatal %v)", got, tc.want, tc.fatal)
			}
		})
	}
}

func TestCheckerLetsRootIntoUnreadableDirsButSaysWhoModelsRunAs(t *testing.T) {
	c := &Checker{}
	if !strings.HasPrefix(c.who(), "user ") && !strings.HasPrefix(c.who(), "uid ") {
		t.Fatalf("who() = %q", c.who())
	}
	if c := (&Checker{RunAs: &RunAs{Name: "nobody"}}); c.who() != "user nobody" {
		t.Fatalf("who() = %q", c.who())
	}
}
