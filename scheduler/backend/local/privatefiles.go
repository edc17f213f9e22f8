package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"inferd/scheduler/backend"
)

// Private files: what the backend keeps for inferd alone (every team's
// model logs, the pid files, the uid table) is made with modes that hold
// whatever the mode of the directory above (dirs 0700, files 0600), and
// New closes what an earlier inferd, or an admin who made the data dir
// 0755 beforehand, left open to other users: a model runs under a uid of
// its own, and another team's log must be out of its reach even where the
// data dir itself is not. config.EnsureDataDir closes the data dir too.

// Modes of what the backend writes for itself.
const (
	privateDirMode  = 0o700
	privateFileMode = 0o600
)

// closePrivateTree takes every permission of group and others off dir and
// everything under it (links are left alone: their modes mean nothing),
// and returns how many it changed; with fix false it changes nothing and
// counts what it would. A missing dir is nothing to close.
func closePrivateTree(dir string, fix bool) (int, error) {
	changed := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // gone meanwhile, or never made
			}
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			if fix {
				if err := os.Chmod(path, perm&^0o077); err != nil {
					return err
				}
			}
			changed++
		}
		return nil
	})
	return changed, err
}

// PrivateFiles says whether the log and run dirs (config's LogDir and
// RunDir) are closed to other users, changing nothing: for doctor, beside
// a daemon that closes them when it starts.
func PrivateFiles(logDir, runDir string) backend.Protection {
	return privateFiles(false, logDir, runDir)
}

// privateFiles closes (fix) the backend's trees, the log and run dirs, and
// says whether they are closed.
func privateFiles(fix bool, dirs ...string) backend.Protection {
	p := backend.Protection{Name: backend.ProtectionPrivateFiles}
	var kept []string
	changed := 0
	for _, dir := range dirs {
		if dir == "" {
			continue
		}
		kept = append(kept, dir)
		n, err := closePrivateTree(dir, fix)
		changed += n
		if err != nil {
			p.Detail = fmt.Sprintf("%s stays open to other users (%v): a model may read other teams' logs; make it inferd's user's, mode 0700", dir, err)
			return p
		}
	}
	if !fix && changed > 0 {
		p.Detail = fmt.Sprintf("%d logs, pid files or their dirs are open to other users: inferd closes them when it starts", changed)
		return p
	}
	p.On = true
	switch {
	case len(kept) == 0:
		p.Detail = "no logs or pid files are kept"
	case changed > 0:
		p.Detail = fmt.Sprintf("logs and pid files are inferd's user's only (dirs 0700, files 0600): %d found open to others were closed at start", changed)
	default:
		p.Detail = "logs and pid files are inferd's user's only (dirs 0700, files 0600), whatever the data dir's mode"
	}
	return p
}
