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
	return sweep(ctx, every, func() error {
		_, err := s.ExpireCalls(now().Add(-ttl))
		return err
	})
}

// UsageExpirer is the part of Usage that RunUsageSweeper needs.
type UsageExpirer interface {
	ExpireUsage(before time.Time) (int, error)
}

// RunUsageSweeper deletes the usage roll-ups of hours older than retention
// at once and then every `every`, until ctx ends, as RunSweeper does calls.
func RunUsageSweeper(ctx context.Context, s UsageExpirer, now func() time.Time, retention, every time.Duration) error {
	return sweep(ctx, every, func() error {
		_, err := s.ExpireUsage(now().Add(-retention))
		return err
	})
}

// sweep runs expire at once and then every `every` until ctx ends. A full
// disk is retried on the next tick; any other error ends it.
func sweep(ctx context.Context, every time.Duration, expire func() error) error {
	if every <= 0 {
		return fmt.Errorf("sweeper interval %v: must be positive", every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := expire(); err != nil && !errors.Is(err, ErrStorageFull) {
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
