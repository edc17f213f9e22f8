package local

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// pidFile is the record kept in RunDir/<ID>.pid while a replica runs. It is JSON so
// that the format is explicit and can grow.
type pidFile struct {
	ID        string `json:"id"`
	ProjectID string `json:"projectId,omitempty"`
	Pid       int    `json:"pid"`
	Pgid      int    `json:"pgid"`
}

// pidFilePath is where the pid file of replica id lives.
func pidFilePath(runDir, id string) string { return filepath.Join(runDir, id+".pid") }

// writePidFile writes rec atomically (temp file, then rename), so that killOrphans
// never reads half a record.
func writePidFile(runDir string, rec pidFile) error {
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return fmt.Errorf("create run dir: %w", err)
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	path := pidFilePath(runDir, rec.ID)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write pid file: %w", err)
	}
	return nil
}

// orphanWait bounds how long killOrphans waits for killed groups to disappear, so
// that the GPU memory they held is free before new replicas are placed.
const orphanWait = 2 * time.Second

// killOrphans kills the process groups of replicas started by a previous daemon that
// died without stopping them, as recorded by the pid files in runDir, and removes
// those files. Call it at daemon start, before starting any replica with the same
// runDir. A group is killed only while one of its members has INFERD_REPLICA_ID=<id>
// in its environment, so a recycled pid is left alone; when /proc cannot be read
// nothing is killed. It returns the number of groups killed, after waiting briefly
// for them to be gone. A missing runDir is not an error.
func killOrphans(runDir string, log zerolog.Logger) (int, error) {
	entries, err := os.ReadDir(runDir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kill orphans: %w", err)
	}
	var killed []int
	var errs []error
	groups, procErr := processGroups()
	if procErr != nil {
		log.Warn().Err(procErr).Msg("cannot read /proc; leaving orphaned replicas alone")
	}
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(runDir, name)
		if strings.HasSuffix(name, ".pid.tmp") {
			os.Remove(path) // a write interrupted by the daemon's death
			continue
		}
		if !strings.HasSuffix(name, ".pid") || e.IsDir() {
			continue
		}
		rec, err := readPidFile(path)
		switch {
		case err != nil:
			log.Warn().Err(err).Str("file", path).Msg("ignoring unreadable replica pid file")
		case procErr == nil && groupHasReplica(groups[rec.Pgid], rec.ID):
			if err := syscall.Kill(-rec.Pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("kill replica %s group %d: %w", rec.ID, rec.Pgid, err))
				continue // keep the file: the group may still be there next time
			}
			log.Warn().Str("replica", rec.ID).Str("project", rec.ProjectID).Int("pgid", rec.Pgid).
				Msg("killed orphaned replica from a previous run")
			killed = append(killed, rec.Pgid)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pid file: %w", err))
		}
	}
	waitGroupsGone(killed, orphanWait)
	if err := errors.Join(errs...); err != nil {
		return len(killed), fmt.Errorf("kill orphans: %w", err)
	}
	return len(killed), nil
}

// readPidFile parses one pid file.
func readPidFile(path string) (pidFile, error) {
	var rec pidFile
	data, err := os.ReadFile(path)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("parse %s: %w", path, err)
	}
	if rec.ID == "" || rec.Pgid <= 1 {
		return rec, fmt.Errorf("parse %s: missing id or pgid", path)
	}
	return rec, nil
}

// processGroups maps each process group to its live (non-zombie) members by reading
// /proc/<pid>/stat.
func processGroups() (map[int][]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	groups := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pgid, state, ok := procStat(pid); ok && state != 'Z' {
			groups[pgid] = append(groups[pgid], pid)
		}
	}
	return groups, nil
}

// procStat returns the process group and state of pid from /proc/<pid>/stat.
func procStat(pid int) (pgid int, state byte, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so
	// parse from the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	pgid, err = strconv.Atoi(f[2])
	if err != nil {
		return 0, 0, false
	}
	return pgid, f[0][0], true
}

// groupHasReplica reports whether any of pids has INFERD_REPLICA_ID=id in its
// environment. An unreadable environment counts as no.
func groupHasReplica(pids []int, id string) bool {
	want := []byte("INFERD_REPLICA_ID=" + id)
	for _, pid := range pids {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(data, []byte{0}) {
			if bytes.Equal(kv, want) {
				return true
			}
		}
	}
	return false
}

// waitGroupsGone polls until no live process is left in any of pgids, or until
// limit. Killed orphans are not our children, so there is nothing to wait on.
func waitGroupsGone(pgids []int, limit time.Duration) {
	if len(pgids) == 0 {
		return
	}
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		groups, err := processGroups()
		if err != nil {
			return
		}
		alive := false
		for _, pgid := range pgids {
			alive = alive || len(groups[pgid]) > 0
		}
		if !alive {
			return
		}
		<-tick.C
	}
}
