package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Expirer is the part of Calls that RunSweeper needs.
type Expirer interface {
	ExpireCalls(finishedBefore time.Time) (int, error)
}

// RunSweeper deletes the finished calls of s older than ttl (as now tells
// the time) at once and then every `every`, until ctx ends (then it returns
// nil). A full disk is retried on the next tick; any other error ends it.
func RunSweeper(ctx context.Context, s Expirer, now func() time.Time, ttl, every time.Duration) error {
	if every <= 0 {
		return fmt.Errorf("sweeper interval %v: must be positive", every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := s.ExpireCalls(now().Add(-ttl)); err != nil && !errors.Is(err, ErrStorageFull) {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
