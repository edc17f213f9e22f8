//go:build !cgo

package cudackpt

import "fmt"

// Driver is the CUDA driver's checkpoint API; a build without cgo has none.
type Driver struct{}

// Open fails: calling the driver needs cgo.
func Open() (*Driver, error) {
	return nil, fmt.Errorf("%w: inferd was built without cgo", ErrUnsupported)
}

// Version is 0: there is no driver.
func (d *Driver) Version() int { return 0 }

// VersionString is "none".
func (d *Driver) VersionString() string { return "none" }

// State fails: there is no driver.
func (d *Driver) State(int) (State, error) { return 0, ErrUnsupported }

// Lock fails: there is no driver.
func (d *Driver) Lock(int, uint32) error { return ErrUnsupported }

// Checkpoint fails: there is no driver.
func (d *Driver) Checkpoint(int) error { return ErrUnsupported }

// Restore fails: there is no driver.
func (d *Driver) Restore(int) error { return ErrUnsupported }

// Unlock fails: there is no driver.
func (d *Driver) Unlock(int) error { return ErrUnsupported }
