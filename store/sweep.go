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

// Outages is told of the outages a periodic job meets: Down at the first
// try that finds the store unavailable (ErrUnavailable: a cluster without
// quorum, or this node cut off from it), Up at the next try that works.
// A job tries again at every tick while the store is down, so it tells
// each outage once, not once a tick. Nil tells nothing.
type Outages interface {
	Down(job string, err error)
	Up(job string)
}

// RunSweeper deletes the finished calls of s older than ttl (as now tells
// the time) at once and then every `every`, until ctx ends (then it returns
// nil). A full disk, and a store that does not answer (told to outages),
// are retried on the next tick; any other error ends it.
func RunSweeper(ctx context.Context, s Expirer, now func() time.Time, ttl, every time.Duration, outages Outages) error {
	return sweep(ctx, every, "expire calls", outages, func() error {
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
func RunUsageSweeper(ctx context.Context, s UsageExpirer, now func() time.Time, retention, every time.Duration, outages Outages) error {
	return sweep(ctx, every, "expire usage", outages, func() error {
		_, err := s.ExpireUsage(now().Add(-retention))
		return err
	})
}

// sweep runs expire at once and then every `every` until ctx ends. A full
// disk and an unavailable store are retried on the next tick (losing
// quorum is a state the node waits out, never a reason to stop); any other
// error ends it.
func sweep(ctx context.Context, every time.Duration, job string, outages Outages, expire func() error) error {
	if every <= 0 {
		return fmt.Errorf("sweeper interval %v: must be positive", every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	down := false
	for {
		err := expire()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrUnavailable):
			if !down && outages != nil {
				outages.Down(job, err)
			}
			down = true
		case err != nil && !errors.Is(err, ErrStorageFull):
			return err
		case down:
			// Answered (a full disk is an answer): the outage is over.
			if outages != nil {
				outages.Up(job)
			}
			down = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// UntilAnswered runs try until it ends in anything but ErrUnavailable, and
// returns that; between tries it waits `every`. It is how a job that must
// read the store before it can begin (a node's recovery at start-up)
// waits out an outage rather than end the node. The outage is told to
// outages once. It returns ctx.Err() once ctx ends.
func UntilAnswered(ctx context.Context, every time.Duration, job string, outages Outages, try func() error) error {
	down := false
	for {
		err := try()
		if !errors.Is(err, ErrUnavailable) {
			if down && outages != nil {
				outages.Up(job)
			}
			return err
		}
		if !down && outages != nil {
			outages.Down(job, err)
		}
		down = true
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
