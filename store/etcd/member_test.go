package etcd

import (
	"context"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/internal/testenv"
)

// A node whose member joined as a learner reaches the cluster through the
// voters: a learner refuses the store's requests.
func TestLearnersNodeReachesTheVoters(t *testing.T) {
	voter := startMember(t, t.TempDir())
	cli, err := clientv3.New(clientv3.Config{Endpoints: voter.ClientURLs(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	peer := "http://" + testenv.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.MemberAddAsLearner(ctx, []string{peer}); err != nil {
		t.Fatal(err)
	}
	learner, err := StartMember(MemberConfig{
		Name: "learner", DataDir: t.TempDir(), PeerURL: peer, ClientURL: "http://" + testenv.FreeAddr(t),
		InitialCluster: "test=" + voter.e.Config().AdvertisePeerUrls[0].String() + ",learner=" + peer, Join: true,
		HeartbeatMs: 10, ElectionMs: 100, StartTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer learner.Close()

	if got := voter.Endpoints(); !slices.Equal(got, voter.ClientURLs()) {
		t.Errorf("a voter's endpoints = %v; want its own %v", got, voter.ClientURLs())
	}
	if got := learner.Endpoints(); !slices.Equal(got, voter.ClientURLs()) {
		t.Errorf("a learner's endpoints = %v; want the voter's %v", got, voter.ClientURLs())
	}
	s, err := Open(Options{Endpoints: learner.Endpoints(), Node: "learner"})
	if err != nil {
		t.Fatalf("open the store through a learner's endpoints: %v", err)
	}
	defer s.Close()
	if _, err := s.EnsureTeam("acme"); err != nil {
		t.Errorf("write through a learner's endpoints: %v", err)
	}
}
