package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// scripted answers each ExpireCalls with the next error of its script (nil
// once the script is spent) and counts the tries.
type scripted struct {
	mu     sync.Mutex
	script []error
	tries  int
}

func (s *scripted) ExpireCalls(time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tries++
	if len(s.script) == 0 {
		return 0, nil
	}
	err := s.script[0]
	s.script = s.script[1:]
	return 0, err
}

func (s *scripted) ExpireUsage(before time.Time) (int, error) { return s.ExpireCalls(before) }

// outageLines records what a job told of its outages.
type outageLines struct {
	mu    sync.Mutex
	lines []string
}

func (o *outageLines) Down(job string, err error) { o.add("down " + job) }
func (o *outageLines) Up(job string)              { o.add("up " + job) }
func (o *outageLines) add(s string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lines = append(o.lines, s)
}

var errUnavailableStore = fmt.Errorf("expire calls: etcd: context deadline exceeded: %w", ErrUnavailable)

// TestSweepersWaitOutAnUnavailableStore: a store without quorum is a
// state the sweepers wait out, tick after tick, telling the outage once
// when it begins and once when it ends; they go on sweeping after it.
// Any other error still ends them.
func TestSweepersWaitOutAnUnavailableStore(t *testing.T) {
	run := map[string]func(ctx context.Context, s *scripted, o Outages) error{
		"expire calls": func(ctx context.Context, s *scripted, o Outages) error {
			return RunSweeper(ctx, s, time.Now, time.Hour, time.Minute, o)
		},
		"expire usage": func(ctx context.Context, s *scripted, o Outages) error {
			return RunUsageSweeper(ctx, s, time.Now, time.Hour, time.Minute, o)
		},
	}
	for job, sweep := range run {
		t.Run(job+" goes on through an outage", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &scripted{script: []error{errUnavailableStore, errUnavailableStore, errUnavailableStore, nil, errUnavailableStore}}
				o := &outageLines{}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- sweep(ctx, s, o) }()
				time.Sleep(10 * time.Minute) // the bubble's clock: ten ticks
				synctest.Wait()
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("the sweeper ended with %v; want it to run until cancelled", err)
				}
				if s.tries != 11 {
					t.Errorf("%d tries in ten ticks; want 11 (one at once, one a tick)", s.tries)
				}
				want := []string{"down " + job, "up " + job, "down " + job, "up " + job}
				if !slices.Equal(o.lines, want) {
					t.Errorf("outages told: %q; want %q", o.lines, want)
				}
			})
		})
		t.Run(job+" ends on another error", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				broken := errors.New("record does not decode")
				s := &scripted{script: []error{errUnavailableStore, broken}}
				err := sweep(t.Context(), s, &outageLines{})
				if !errors.Is(err, broken) {
					t.Errorf("the sweeper ended with %v; want %v", err, broken)
				}
			})
		})
	}
}

// TestUntilAnsweredWaitsOutAnUnavailableStore: a read that must succeed
// before a job begins is tried again while the store is unavailable, and
// what it ends with, nil or another error, is returned; a cancelled wait
// returns the context's error.
func TestUntilAnsweredWaitsOutAnUnavailableStore(t *testing.T) {
	broken := errors.New("broken")
	for _, tc := range []struct {
		name   string
		script []error
		want   error
		tries  int
		told   []string
	}{
		{"answered at once", nil, nil, 1, nil},
		{"answered after an outage", []error{errUnavailableStore, errUnavailableStore}, nil, 3, []string{"down job", "up job"}},
		{"another error after an outage", []error{errUnavailableStore, broken}, broken, 2, []string{"down job", "up job"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &scripted{script: tc.script}
				o := &outageLines{}
				err := UntilAnswered(t.Context(), time.Second, "job", o, func() error {
					_, err := s.ExpireCalls(time.Time{})
					return err
				})
				if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
					t.Errorf("UntilAnswered = %v; want %v", err, tc.want)
				}
				if s.tries != tc.tries || !slices.Equal(o.lines, tc.told) {
					t.Errorf("%d tries, told %q; want %d, %q", s.tries, o.lines, tc.tries, tc.told)
				}
			})
		})
	}
	t.Run("cancelled while the store is down", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(time.Minute, cancel)
			err := UntilAnswered(ctx, time.Second, "job", nil, func() error { return errUnavailableStore })
			if !errors.Is(err, context.Canceled) {
				t.Errorf("UntilAnswered = %v; want context.Canceled", err)
			}
		})
	})
}
