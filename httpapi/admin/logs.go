package admin

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/respond"
	"inferd/scheduler/backend"
	"inferd/store"
)

// Bounds of a log read.
const (
	defaultLogLines = 200  // log lines shown
	maxLogLines     = 5000 // ?lines= cap
)

// WithLogs lets GET /admin/logs read the replica logs the backend keeps.
func WithLogs(logs backend.Logs) Option {
	return func(a *admin) { a.replicaLogs = logs }
}

// logs handles GET /admin/logs/:project[?replica=ID][&lines=N][&follow=1]:
// the last lines of a replica's log as text, then, with follow, what is
// written to it until the client or the server goes away. Without a
// replica it picks the project's most recently written log and names it in
// the X-Inferd-Replica header. Deleted projects' logs are readable too.
func (a *admin) logs(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	project, rid := ps.ByName("project"), r.URL.Query().Get("replica")
	n, err := respond.QueryInt(r, "lines", defaultLogLines, maxLogLines)
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	if a.replicaLogs == nil || !store.ValidID(project) {
		respond.Error(w, r, a.log, respond.NotFound("no logs for project %s", respond.Truncate(project, 64)))
		return
	}
	if rid != "" && (!store.ValidID(rid) || !strings.HasPrefix(rid, project+"-")) {
		respond.Error(w, r, a.log, respond.NotFound("no log for replica %s of project %s", respond.Truncate(rid, 64), project))
		return
	}
	// Whichever team the project belongs or belonged to: the newest log of
	// the replica asked for, or of any replica.
	logs, err := a.replicaLogs.ReplicaLogs("", project)
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	if rid != "" {
		logs = slices.DeleteFunc(logs, func(l backend.Log) bool { return l.Replica != rid })
	}
	if len(logs) == 0 {
		if rid != "" {
			respond.Error(w, r, a.log, respond.NotFound("no log for replica %s of project %s", rid, project))
		} else {
			respond.Error(w, r, a.log, respond.NotFound("no logs for project %s", project))
		}
		return
	}
	l := logs[0]
	rid = l.Replica
	lines, next, err := a.replicaLogs.TailLog(l, n)
	switch {
	case errors.Is(err, backend.ErrNoLog):
		respond.Error(w, r, a.log, respond.NotFound("no log for replica %s of project %s", rid, project))
		return
	case err != nil:
		respond.Error(w, r, a.log, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Inferd-Replica", rid)
	for _, line := range lines {
		fmt.Fprintln(w, line)
	}
	if r.URL.Query().Get("follow") != "1" {
		return
	}
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	if err := fw.rc.Flush(); err != nil {
		return // the client is gone
	}
	// Ends when the client hangs up or the server shuts down (serve.go
	// cancels the admin server's base context on Shutdown).
	if err := a.replicaLogs.FollowLog(r.Context(), l, next, fw); err != nil && r.Context().Err() == nil {
		a.log.Debug().Err(err).Str("project", project).Str("replica", rid).Msg("log follow ended")
	}
}

// flushWriter sends every write to the client at once.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err != nil {
		return n, err
	}
	return n, f.rc.Flush()
}
