package store

import (
	"fmt"
	"time"
)

// The parts of a write that do not depend on the storage, for the
// implementations to share.

// PrepareCallWrite is the start of every SaveCallAsync: it returns the call
// as it will be stored (a final call without Finished stamped now) and a
// done that is never nil, or reports false after handing done the refusal
// of a call whose id ValidateCallID rejects.
func PrepareCallWrite(c Call, done func(error), now func() time.Time) (Call, func(error), bool) {
	if done == nil {
		done = func(error) {}
	}
	if err := ValidateCallID(c.ID); err != nil {
		done(fmt.Errorf("save call %q: %w", c.ID, err))
		return c, done, false
	}
	if c.State.Done() && c.Finished.IsZero() {
		c.Finished = now().UTC()
	}
	return c, done, true
}

// PutOne is PutProject by way of PutProjects.
func PutOne(s interface {
	PutProjects([]Project) ([]Change, error)
}, p Project) (Change, error) {
	changes, err := s.PutProjects([]Project{p})
	if err != nil {
		return "", err
	}
	return changes[0], nil
}

// ValidateAll returns the first validation error of ps, as PutProjects
// must before it writes anything.
func ValidateAll(ps []Project) error {
	for _, p := range ps {
		if err := p.Validate(); err != nil {
			return err
		}
	}
	return nil
}
