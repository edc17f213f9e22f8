package bolt

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	bbolt "go.etcd.io/bbolt"
)

// A migration moves a data file from one schema version to the next. It runs
// inside Open's single write transaction together with every later step and
// the new version number, so a file is migrated completely or not at all.
type migration struct {
	why string // what changes, for the error message if it fails
	run func(tx *bbolt.Tx) error
}

// migrations[v] moves a file from schema version v to v+1, so
// len(migrations) == SchemaVersion (TestMigrationsEndAtSchemaVersion).
// Version 0 is the empty file bbolt creates: a new file is "migrated" from 0,
// the same path every older file takes.
//
// To change the layout: append a step, bump SchemaVersion, commit a data file
// written by the current binary as testdata/schema-v<old>.db (see
// TestOpenMigratesEveryOlderSchema), and check that the step is idempotent
// with respect to what allBuckets creates. Adding a bucket or an omitempty
// field needs no step: allBuckets covers new buckets on every open.
var migrations = []migration{
	{why: "create the version 1 buckets", run: createBuckets(
		bucketMeta, bucketTeams, bucketKeys, bucketProjects, bucketModelKeys,
		bucketCalls, bucketCallPending, bucketCallFinished, bucketCallExpiry)},
	{why: "move call inputs and outputs out of the call records", run: splitPayloads},
}

func createBuckets(names ...[]byte) func(tx *bbolt.Tx) error {
	return func(tx *bbolt.Tx) error {
		for _, name := range names {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		return nil
	}
}

// Migration says what Open did to the file's schema.
type Migration struct {
	// From and To are the schema versions before and after Open; equal when
	// nothing was migrated. From is 0 for a file Open initialised.
	From, To int
	// Copy is the file holding the data as it was before the migration, for
	// a downgrade; empty when nothing was migrated or the file was new.
	Copy string
}

// Migrated reports whether Open moved existing data to a newer schema.
func (m Migration) Migrated() bool { return m.From > 0 && m.From < m.To }

// fileSchema reads the schema version recorded in the file: 0 for a file
// without inferd's meta bucket and no other bucket (new), an error for a
// foreign, unreadable or newer file.
func fileSchema(tx *bbolt.Tx, path string, latest int) (int, error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		// A file bbolt just created has no buckets at all. Any other bucket
		// means someone else's bbolt file: refuse rather than mix data in.
		var other []byte
		_ = tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
			other = append([]byte(nil), name...)
			return errStopIteration
		})
		if other != nil {
			return 0, corruptError(path, fmt.Sprintf("bbolt file without inferd's meta bucket (has bucket %q)", other))
		}
		return 0, nil
	}
	raw := meta.Get(keySchema)
	v, err := strconv.Atoi(string(raw))
	if err != nil || v < 1 {
		return 0, &openError{
			msg: fmt.Sprintf("data file %s has unknown schema version %q; this inferd supports schema version %d: upgrade inferd or restore from a backup",
				path, raw, latest),
			kind: ErrSchema,
		}
	}
	if v > latest {
		return 0, &openError{
			msg: fmt.Sprintf("data file %s has schema version %d, newer than version %d that this inferd supports: upgrade inferd, or restore the backup taken before the upgrade",
				path, v, latest),
			kind: ErrSchema,
		}
	}
	return v, nil
}

// migrate brings the file in tx from its schema version to len(steps) and
// makes sure every current bucket exists, so the rest of the package can rely
// on tx.Bucket never returning nil. It returns the version it started from.
func migrate(tx *bbolt.Tx, path string, steps []migration) (from int, err error) {
	from, err = fileSchema(tx, path, len(steps))
	if err != nil {
		return 0, err
	}
	for v := from; v < len(steps); v++ {
		if err := steps[v].run(tx); err != nil {
			return 0, fmt.Errorf("migrate from schema version %d to %d (%s): %w", v, v+1, steps[v].why, err)
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return 0, fmt.Errorf("migrate to schema version %d: no meta bucket after the step", v+1)
		}
		if err := meta.Put(keySchema, []byte(strconv.Itoa(v+1))); err != nil {
			return 0, fmt.Errorf("write schema version %d: %w", v+1, err)
		}
	}
	if err := createBuckets(allBuckets()...)(tx); err != nil {
		return 0, err
	}
	return from, nil
}

// copyBeforeMigration writes the file as it is now to PATH.schema-vN (N its
// current version) when Open is about to migrate existing data, so an
// operator can go back to the older inferd. It returns the copy's path, or ""
// when there is nothing to migrate. The copy is written to a temporary name,
// fsynced and renamed, so a crash never leaves half a copy under that name.
func copyBeforeMigration(db *bbolt.DB, path string, latest int) (string, error) {
	var copyPath string
	err := db.View(func(tx *bbolt.Tx) error {
		v, err := fileSchema(tx, path, latest)
		if err != nil || v == 0 || v == latest {
			return nil // nothing to migrate, or a refusal migrate reports
		}
		copyPath = fmt.Sprintf("%s.schema-v%d", path, v)
		tmp := copyPath + ".tmp"
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = tx.WriteTo(f)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, copyPath)
		}
		if err != nil {
			os.Remove(tmp)
			return err
		}
		return syncDir(filepath.Dir(copyPath))
	})
	if err != nil {
		return "", fmt.Errorf("copy data file %s before migrating it: %w", path, err)
	}
	return copyPath, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
