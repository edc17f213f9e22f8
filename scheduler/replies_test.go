package scheduler

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"inferd/scheduler/backend"
)

// TestReplyBudgetMakesKnownLengthsWaitAndRefusesWhatCannotFit: within
// limits.replyBytes a reply of known length waits for room, in the order
// replies asked, holding nothing while it waits, and gets it as holders
// give theirs back; a reply larger than the budget, or one of unknown
// length whose growth finds it full, is refused at once, naming the
// setting; a waiter whose call ends leaves the line.
func TestReplyBudgetMakesKnownLengthsWaitAndRefusesWhatCannotFit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newReplyBudget(100)
		ctx := context.Background()
		first, second, third, gone := b.account(), b.account(), b.account(), b.account()
		if err := first.Take(ctx, 60, true); err != nil {
			t.Fatal(err)
		}
		var over *backend.ReplyBudgetError
		if err := b.account().Take(ctx, 101, true); !errors.As(err, &over) || over.Max != 100 {
			t.Errorf("a reply larger than the budget: %v", err)
		}
		if err := b.account().Take(ctx, 50, false); !errors.As(err, &over) {
			t.Errorf("a growth that does not fit: %v", err)
		}

		got := make(chan string, 3)
		cancelled, cancel := context.WithCancel(ctx)
		go func() {
			if err := second.Take(ctx, 60, true); err == nil {
				got <- "second"
			}
		}()
		synctest.Wait()
		go func() {
			err := gone.Take(cancelled, 30, true)
			got <- "gone: " + err.Error()
		}()
		synctest.Wait()
		go func() {
			if err := third.Take(ctx, 10, true); err == nil {
				got <- "third"
			}
		}()
		synctest.Wait()
		select {
		case g := <-got:
			t.Fatalf("%s got room while the first reply held 60 of 100 and the second waited ahead", g)
		default:
		}
		if b.inUse() != 60 {
			t.Errorf("waiters hold %d bytes, want none (60 in use)", b.inUse()-60)
		}
		cancel()
		synctest.Wait()
		if g := <-got; g != "gone: context canceled" {
			t.Errorf("the cancelled waiter: %s", g)
		}
		first.release()
		synctest.Wait()
		if g1, g2 := <-got, <-got; g1+g2 != "secondthird" && g1+g2 != "thirdsecond" {
			t.Errorf("after the first let go: %s, %s; want the second and the third (60 + 10 fit)", g1, g2)
		}
		if b.inUse() != 70 {
			t.Errorf("%d in use, want 70", b.inUse())
		}
		second.release()
		third.release()
		first.release() // twice: nothing more to give back
		if b.inUse() != 0 {
			t.Errorf("%d in use once every reply let go", b.inUse())
		}
	})
}
