package etcd

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestSharedReadsNeverAnswerWithAReadBegunBeforeTheCall: callers that ask
// while a read of their key is in flight do not get its answer (it may
// predate a write committed before they asked); they share the next read,
// one request for all of them.
func TestSharedReadsNeverAnswerWithAReadBegunBeforeTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reads sharedReads[*clientv3.GetResponse]
		gate := make(chan struct{})
		var issued atomic.Int32
		read := func(ctx context.Context) (*clientv3.GetResponse, error) {
			n := issued.Add(1)
			<-gate
			return &clientv3.GetResponse{Kvs: []*mvccpb.KeyValue{{Value: fmt.Appendf(nil, "read %d", n)}}}, nil
		}
		got := make([]string, 4)
		var wg sync.WaitGroup
		ask := func(i int) {
			wg.Go(func() {
				resp, err := reads.get(context.Background(), "k", read)
				if err != nil {
					t.Error(err)
					return
				}
				got[i] = string(resp.Kvs[0].Value)
			})
		}
		ask(0)
		synctest.Wait() // read 1 in flight
		ask(1)
		ask(2)
		ask(3)
		synctest.Wait() // all three wait behind it
		close(gate)
		wg.Wait()
		if got[0] != "read 1" {
			t.Errorf("the first caller got %q, want read 1", got[0])
		}
		for i := 1; i < 4; i++ {
			if got[i] != "read 2" {
				t.Errorf("caller %d, who asked while read 1 was in flight, got %q; want read 2", i, got[i])
			}
		}
		if n := issued.Load(); n != 2 {
			t.Errorf("%d reads issued for 4 callers, want 2", n)
		}
		if len(reads.keys) != 0 {
			t.Errorf("keys left after the reads: %v", reads.keys)
		}
	})
}
