//go:build !linux

package bolt

import bbolt "go.etcd.io/bbolt"

// releaseMapped is Linux-only (see release_linux.go); elsewhere the mapped pages
// stay counted until the kernel reclaims them.
func releaseMapped(*bbolt.DB, string) {}

// releaseRange is Linux-only (see release_linux.go).
func releaseRange(*bbolt.Tx, []byte) {}
