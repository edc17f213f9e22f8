//go:build !linux

package store

import bolt "go.etcd.io/bbolt"

// releaseMapped is Linux-only (see release_linux.go); elsewhere the mapped pages
// stay counted until the kernel reclaims them.
func releaseMapped(*bolt.DB, string) {}
