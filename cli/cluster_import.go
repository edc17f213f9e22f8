package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"inferd/store"
	"inferd/store/bolt"
	"inferd/store/etcd"
)

// importCounts is what import did with one kind of record.
type importCounts struct{ written, present, skipped int }

func (c *clusterCommand) importBolt(_ context.Context, args []string) error {
	fs := subFlags("cluster import")
	force := fs.Bool("force", false, "import into a cluster that holds teams, keys or projects the file lacks (nothing is overwritten)")
	eps := endpointsFlag(fs)
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: cluster import needs exactly one BOLT-FILE (a single box's inferd.db)", errUsage)
	}
	path := pos[0]
	conn, err := c.env.connect(*eps)
	if err != nil {
		return err
	}
	cfg := conn.cfg
	endpoints, clientTLS := conn.cli.Endpoints(), conn.tls
	conn.close()

	src, done, err := openImportSource(path)
	if err != nil {
		return fmt.Errorf("cluster import: %w", err)
	}
	defer done()
	dst, err := etcd.Open(etcd.Options{Endpoints: endpoints, TLS: clientTLS, Prefix: cfg.Cluster.Etcd.Prefix,
		Node: cfg.Cluster.Name, DialTimeout: cfg.Cluster.Etcd.DialTimeout})
	if err != nil {
		return fmt.Errorf("cluster import: %w", err)
	}
	defer dst.Close()

	teams, err := src.ListTeams()
	if err != nil {
		return fmt.Errorf("cluster import: read %s: %w", path, err)
	}
	keys, err := src.ListKeys("")
	if err != nil {
		return fmt.Errorf("cluster import: read %s: %w", path, err)
	}
	projects, err := src.ListProjects("")
	if err != nil {
		return fmt.Errorf("cluster import: read %s: %w", path, err)
	}
	if !*force {
		if err := refuseForeignRecords(dst, teams, keys, projects); err != nil {
			return err
		}
	}

	var t, k, p, calls importCounts
	var problems []error
	count := func(n *importCounts, created bool, err error) {
		switch {
		case err != nil:
			n.skipped++
			problems = append(problems, err)
		case created:
			n.written++
		default:
			n.present++
		}
	}
	for _, team := range teams {
		secret, err := src.TeamSecret(team.ID)
		if err != nil {
			return fmt.Errorf("cluster import: read %s: %w", path, err)
		}
		created, err := dst.ImportTeam(team, secret)
		count(&t, created, err)
	}
	for _, key := range keys {
		created, err := dst.ImportKey(key)
		count(&k, created, err)
	}
	for _, proj := range projects {
		created, err := dst.ImportProject(proj)
		count(&p, created, err)
	}
	expired, pending := 0, 0
	keepAfter := time.Now().Add(-cfg.ResultTTL)
	err = src.EachCall(func(call store.Call) error {
		if call.State.Done() && call.Finished.Before(keepAfter) {
			expired++ // the sweeper would delete it at once
			return nil
		}
		created, err := dst.ImportCall(call)
		if errors.Is(err, etcd.ErrPayloadTooLarge) {
			count(&calls, false, err) // reported; the rest goes on
			return nil
		}
		if err != nil {
			return err // etcd failing: stop; running again resumes
		}
		count(&calls, created, nil)
		if created && !call.State.Done() {
			pending++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cluster import: %w", err)
	}

	w := c.env.stdout
	fmt.Fprintf(w, "imported %s into etcd (prefix %s):\n", path, dst.Prefix())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RECORDS\tWRITTEN\tALREADY THERE\tNOT COPIED")
	for _, r := range []struct {
		name string
		n    importCounts
	}{{"teams", t}, {"keys", k}, {"projects", p}, {"calls", calls}} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", r.name, r.n.written, r.n.present, r.n.skipped)
	}
	tw.Flush()
	if expired > 0 {
		fmt.Fprintf(w, "%d finished calls older than resultTTL (%s) were left out\n", expired, cfg.ResultTTL)
	}
	if pending > 0 {
		fmt.Fprintf(w, "%d calls not finished are pending on node %s: it runs them again (or fails those that were running) when it starts\n",
			pending, cfg.Cluster.Name)
	}
	for _, e := range problems {
		fmt.Fprintf(w, "not copied: %v\n", e)
	}
	if len(problems) > 0 {
		return fmt.Errorf("cluster import: %d records were not copied (listed above)", len(problems))
	}
	return nil
}

// refuseForeignRecords fails when the cluster holds a team, key or project
// the file does not: it is not a new cluster (nor one this file was
// imported into before), and merging two sites' records is a decision for
// --force.
func refuseForeignRecords(dst *etcd.Store, teams []store.Team, keys []store.APIKey, projects []store.Project) error {
	ids := map[string]bool{}
	for _, t := range teams {
		ids["team "+t.ID] = true
	}
	for _, k := range keys {
		ids["key "+k.ID] = true
	}
	for _, p := range projects {
		ids["project "+p.ID] = true
	}
	haveTeams, err := dst.ListTeams()
	if err != nil {
		return fmt.Errorf("cluster import: %w", err)
	}
	haveKeys, err := dst.ListKeys("")
	if err != nil {
		return fmt.Errorf("cluster import: %w", err)
	}
	haveProjects, err := dst.ListProjects("")
	if err != nil {
		return fmt.Errorf("cluster import: %w", err)
	}
	foreign := notIn(ids, "team ", haveTeams, func(t store.Team) string { return t.ID })
	foreign = append(foreign, notIn(ids, "key ", haveKeys, func(k store.APIKey) string { return k.ID })...)
	foreign = append(foreign, notIn(ids, "project ", haveProjects, func(p store.Project) string { return p.ID })...)
	if len(foreign) == 0 {
		return nil
	}
	if len(foreign) > 5 {
		foreign = append(foreign[:5], fmt.Sprintf("and %d more", len(foreign)-5))
	}
	return fmt.Errorf("refusing to import: the cluster already holds records the file does not (%v); "+
		"pass --force to add the file's records beside them (records with the same id are kept as the cluster has them)", foreign)
}

// notIn returns kind+id of each record of have whose kind+id is not in ids.
func notIn[T any](ids map[string]bool, kind string, have []T, id func(T) string) []string {
	var out []string
	for _, r := range have {
		if !ids[kind+id(r)] {
			out = append(out, kind+id(r))
		}
	}
	return out
}

// openImportSource opens a single box's data file for import, read-only: a
// daemon that still serves from it holds its lock, so it is refused (stop
// the daemon first: calls it took meanwhile would not be copied). A file
// of an older schema is read through a migrated copy in a temporary
// directory, as this inferd reads only its own layout; the file itself is
// never changed. done closes the store and removes the copy.
func openImportSource(path string) (src *bolt.Store, done func(), err error) {
	src, err = bolt.Open(path, bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		return nil, nil, err
	}
	if src.Migration().From >= bolt.SchemaVersion {
		return src, func() { src.Close() }, nil
	}
	src.Close()
	dir, err := os.MkdirTemp("", "inferd-import-")
	if err != nil {
		return nil, nil, err
	}
	copyPath := filepath.Join(dir, "inferd.db")
	_, err = copyFileSynced(copyPath, path)
	if err == nil {
		src, err = bolt.Open(copyPath, bolt.Options{Timeout: time.Second})
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("migrate a copy of %s: %w", path, err)
	}
	return src, func() { src.Close(); os.RemoveAll(dir) }, nil
}
