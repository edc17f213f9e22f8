package main

// Operations commands: backup, restore and doctor.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"inferd/config"
	"inferd/gpu"
	"inferd/store/bolt"
)

// download streams the body of a GET on the admin API into w.
func (c *adminClient) download(ctx context.Context, path string, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://inferd"+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
			return 0, errors.New(e.Error.Message)
		}
		return 0, fmt.Errorf("admin API: %s", resp.Status)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("admin API: read reply: %w", err)
	}
	return n, nil
}

// daemonAnswers reports whether a daemon answers on the admin socket.
func daemonAnswers(cfg config.Config) bool {
	conn, err := net.DialTimeout("unix", cfg.SocketPath(), time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// dataSummary is what storeSummary found in a data file.
type dataSummary struct {
	teams, projects int
	schema          int // the file's schema version
}

// storeSummary opens a data file read-only (it neither migrates nor touches
// it), counts its teams and projects, and closes it.
func storeSummary(path string) (dataSummary, error) {
	st, err := bolt.Open(path, bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		return dataSummary{}, err
	}
	defer st.Close()
	ts, err := st.ListTeams()
	if err != nil {
		return dataSummary{}, fmt.Errorf("read teams from %s: %w", path, err)
	}
	ps, err := st.ListProjects("")
	if err != nil {
		return dataSummary{}, fmt.Errorf("read projects from %s: %w", path, err)
	}
	return dataSummary{teams: len(ts), projects: len(ps), schema: st.Migration().From}, nil
}

// syncDir fsyncs a directory so a rename in it survives a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// writeFileSynced creates path (mode 0600, failing if it exists), fills it
// with fill, and fsyncs it. On failure the file is removed.
func writeFileSynced(path string, fill func(io.Writer) (int64, error)) (n int64, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(path)
		}
	}()
	if n, err = fill(f); err != nil {
		return n, err
	}
	if err = f.Sync(); err != nil {
		return n, fmt.Errorf("sync %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return n, fmt.Errorf("close %s: %w", path, err)
	}
	return n, nil
}

func backupCommand(ctx context.Context, cfg config.Config, args []string, stdout, stderr io.Writer) error {
	fs := subFlags("backup", stderr)
	force := fs.Bool("force", false, "overwrite FILE if it exists")
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: backup needs exactly one FILE", errUsage)
	}
	dst := pos[0]
	if _, err := os.Stat(dst); err == nil && !*force {
		return fmt.Errorf("%s exists; pass --force to overwrite it", dst)
	}
	tmp := dst + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	var n int64
	err = withAdmin(cfg, func(c *adminClient) error {
		var err error
		n, err = writeFileSynced(tmp, func(w io.Writer) (int64, error) {
			return c.download(ctx, "/admin/backup", w)
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	// Verify the copy before it takes FILE's name, so a bad copy never
	// replaces a good older backup.
	sum, err := storeSummary(tmp)
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("backup failed verification: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("backup: %w", err)
	}
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	fmt.Fprintf(stdout, "backup written to %s (%d bytes, %d teams, %d projects)\n", dst, n, sum.teams, sum.projects)
	return nil
}

func restoreCommand(_ context.Context, cfg config.Config, args []string, stdout, stderr io.Writer) error {
	fs := subFlags("restore", stderr)
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: restore needs exactly one FILE", errUsage)
	}
	src := pos[0]
	if daemonAnswers(cfg) {
		return fmt.Errorf("a daemon is serving on %s: stop the daemon first, then restore", cfg.SocketPath())
	}
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	sum, err := storeSummary(src)
	if errors.Is(err, bolt.ErrCorrupt) {
		// The store's advice ("restore from a backup") reads oddly when the
		// file is the backup.
		return fmt.Errorf("refusing to restore %s: not a usable inferd backup: %s; the current data file is unchanged",
			src, strings.TrimSuffix(err.Error(), "; restore from a backup"))
	}
	if err != nil {
		return fmt.Errorf("refusing to restore %s: %w", src, err)
	}
	if err := cfg.EnsureDataDir(); err != nil {
		return err
	}
	cur := cfg.StorePath()
	// Hold the data file's lock (the one bbolt takes) for the whole swap, so
	// a daemon that starts meanwhile, or one whose socket is gone, cannot
	// have the file open under us.
	if f, err := os.Open(cur); err == nil {
		defer f.Close()
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			return fmt.Errorf("data file %s is in use by another inferd process: stop the daemon first", cur)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("restore: %w", err)
	}

	tmp := cur + ".restore-tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	n, err := writeFileSynced(tmp, func(w io.Writer) (int64, error) {
		in, err := os.Open(src)
		if err != nil {
			return 0, err
		}
		defer in.Close()
		return io.Copy(w, in)
	})
	if err != nil {
		return fmt.Errorf("restore: copy %s: %w", src, err)
	}
	aside := ""
	if _, err := os.Stat(cur); err == nil {
		aside = fmt.Sprintf("%s.before-restore-%d", cur, time.Now().Unix())
		if err := os.Rename(cur, aside); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("restore: move the current data file aside: %w", err)
		}
	}
	if err := os.Rename(tmp, cur); err != nil {
		return fmt.Errorf("restore: put %s in place (the old data file is %s): %w", tmp, aside, err)
	}
	if err := syncDir(cfg.DataDir); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if aside != "" {
		fmt.Fprintf(stdout, "moved the current data file to %s\n", aside)
	}
	fmt.Fprintf(stdout, "restored %s to %s (%d bytes, %d teams, %d projects)\n", src, cur, n, sum.teams, sum.projects)
	fmt.Fprintln(stdout, "start the daemon to serve the restored data")
	return nil
}

// doctorReport prints one line per check and counts failures.
type doctorReport struct {
	out   io.Writer
	fails int
}

func (r *doctorReport) line(status, check, format string, a ...any) {
	if status == "fail" {
		r.fails++
	}
	fmt.Fprintf(r.out, "%-4s  %-11s %s\n", status, check, fmt.Sprintf(format, a...))
}

// doctorCommand checks what inferd needs on this box and says what to fix.
// It loads the config itself so that a broken config is reported as a check.
func doctorCommand(_ context.Context, g globals, environ []string, args []string, stdout, stderr io.Writer) error {
	fs := subFlags("doctor", stderr)
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	r := &doctorReport{out: stdout}
	cfg, err := config.Load(g.configPath, environ, g.overrides)
	if err != nil {
		r.line("fail", "config", "%v: fix the file or the INFERD_* environment", err)
		return fmt.Errorf("doctor: %d check(s) failed", r.fails)
	}
	if g.configPath != "" {
		r.line("ok", "config", "loaded %s", g.configPath)
	} else {
		r.line("ok", "config", "no config file: built-in defaults (pass --config or set INFERD_CONFIG)")
	}

	running := daemonAnswers(cfg)
	doctorDataDir(r, cfg)
	doctorDataFile(r, cfg, running)
	doctorDisk(r, cfg)
	doctorGPU(r, cfg)
	if runAs, ok := doctorModelUser(r, cfg); ok {
		doctorExample(r, runAs)
	}
	doctorListen(r, cfg, running)

	if r.fails > 0 {
		return fmt.Errorf("doctor: %d check(s) failed", r.fails)
	}
	return nil
}

func doctorDataDir(r *doctorReport, cfg config.Config) {
	fi, err := os.Stat(cfg.DataDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		r.line("warn", "data dir", "%s does not exist yet: inferd creates it on first start (its parent must be writable)", cfg.DataDir)
		return
	case err != nil:
		r.line("fail", "data dir", "%v", err)
		return
	case !fi.IsDir():
		r.line("fail", "data dir", "%s is not a directory: point dataDir elsewhere", cfg.DataDir)
		return
	}
	f, err := os.CreateTemp(cfg.DataDir, ".doctor-*")
	if err != nil {
		r.line("fail", "data dir", "%s is not writable by this user (%v): fix its owner or mode", cfg.DataDir, err)
		return
	}
	f.Close()
	os.Remove(f.Name())
	if fi.Mode().Perm()&0o077 != 0 {
		r.line("warn", "data dir", "%s is writable but has mode %o: chmod 700 it, it holds key hashes", cfg.DataDir, fi.Mode().Perm())
		return
	}
	r.line("ok", "data dir", "%s exists and is writable", cfg.DataDir)
}

func doctorDataFile(r *doctorReport, cfg config.Config, running bool) {
	path := cfg.StorePath()
	if running {
		r.line("ok", "data file", "%s: daemon running (admin socket answers)", path)
		return
	}
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		r.line("ok", "data file", "%s does not exist yet: it is created on first start", path)
		return
	}
	if err != nil {
		r.line("fail", "data file", "%v", err)
		return
	}
	sum, err := storeSummary(path)
	switch {
	case errors.Is(err, bolt.ErrInUse):
		r.line("warn", "data file", "%s is locked by another process but no daemon answers on %s", path, cfg.SocketPath())
	case err != nil:
		r.line("fail", "data file", "%v", err)
	case sum.schema < bolt.SchemaVersion:
		r.line("ok", "data file", "%s opens (%d bytes, %d teams, %d projects); schema version %d: the next start migrates it to %d and keeps a copy as %s.schema-v%d",
			path, fi.Size(), sum.teams, sum.projects, sum.schema, bolt.SchemaVersion, path, sum.schema)
	default:
		r.line("ok", "data file", "%s opens (%d bytes, %d teams, %d projects, schema version %d)", path, fi.Size(), sum.teams, sum.projects, sum.schema)
	}
}

func doctorDisk(r *doctorReport, cfg config.Config) {
	// Measure the data dir, or the nearest existing parent if it does not exist yet.
	dir := cfg.DataDir
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		r.line("warn", "disk", "cannot measure free space in %s: %v", dir, err)
		return
	}
	free := st.Bavail * uint64(st.Bsize)
	const gib = 1 << 30
	if free < gib {
		r.line("warn", "disk", "%s has only %s free: call records stop being written when the disk fills", dir, humanBytes(free))
		return
	}
	r.line("ok", "disk", "%s free in %s", humanBytes(free), dir)
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func doctorGPU(r *doctorReport, cfg config.Config) {
	switch {
	case len(cfg.GPU.Simulate) > 0:
		r.line("warn", "gpu", "%d simulated GPU(s) from gpu.simulate: the NVIDIA driver is not used; remove gpu.simulate to serve on real GPUs", len(cfg.GPU.Simulate))
		return
	case cfg.GPU.Disabled:
		r.line("warn", "gpu", "gpu.disabled is set: the NVIDIA driver is not checked and every project runs on CPU")
		return
	}
	var buf bytes.Buffer
	inv := gpu.Discover(zerolog.New(&buf))
	defer inv.Close()
	if n := inv.Count(); n > 0 {
		r.line("ok", "gpu", "%d NVIDIA GPU(s) via %s", n, inv.Source())
		return
	}
	detail := ""
	var entry struct {
		Message string `json:"message"`
		NVML    string `json:"nvml"`
		Error   string `json:"error"`
	}
	if line, _, _ := strings.Cut(buf.String(), "\n"); json.Unmarshal([]byte(line), &entry) == nil {
		switch cause := entry.NVML + entry.Error; {
		case cause != "" && strings.HasPrefix(entry.Message, "no NVIDIA driver"):
			detail = " (NVML: " + cause + ")"
		case cause != "":
			detail = " (" + entry.Message + ": " + cause + ")"
		case entry.Message != "":
			detail = " (" + entry.Message + ")"
		}
	}
	r.line("warn", "gpu", "no NVIDIA driver: CPU only%s; install the NVIDIA driver to serve GPU models", detail)
}

func doctorListen(r *doctorReport, cfg config.Config, running bool) {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err == nil {
		ln.Close()
		r.line("ok", "listen", "%s is free", cfg.Listen)
		return
	}
	if running {
		r.line("ok", "listen", "%s is in use by the running daemon", cfg.Listen)
		return
	}
	r.line("fail", "listen", "cannot listen on %s (%v): stop what uses it or change listen", cfg.Listen, err)
}
