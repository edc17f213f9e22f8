package etcd

import (
	"io"
	"net/http"
	"testing"

	"inferd/internal/testenv"
	"inferd/store/storetest"
)

// TestMemberSyncsItsLogOnEveryWrite: every write the embedded member
// acknowledges has had its write-ahead log fsynced, as etcd's own
// etcd_disk_wal_fsync_duration_seconds counts. A member started with etcd's
// unsafe no-fsync would acknowledge writes that a power loss takes back.
func TestMemberSyncsItsLogOnEveryWrite(t *testing.T) {
	m := startMember(t, t.TempDir())
	s := openStore(t, m, Options{Prefix: "/sync/"})
	before := walFsyncs(t, m)
	const writes = 3
	for i := range writes {
		p := storetest.Project("p", "acme")
		p.MaxReplicas = i + 1
		if _, err := s.PutProject(p); err != nil {
			t.Fatal(err)
		}
	}
	if n := walFsyncs(t, m) - before; n < writes {
		t.Errorf("%d acknowledged writes, %v fsyncs of the write-ahead log; want one or more each", writes, n)
	}
}

// walFsyncs reads the member's count of write-ahead log fsyncs from the
// /metrics etcd serves on its client URL.
func walFsyncs(t *testing.T, m *Member) float64 {
	t.Helper()
	resp, err := http.Get(m.ClientURLs()[0] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	samples, err := testenv.ParseMetrics(body)
	if err != nil {
		t.Fatal(err)
	}
	n, ok := samples["etcd_disk_wal_fsync_duration_seconds_count"]
	if !ok {
		t.Fatalf("etcd's /metrics has no etcd_disk_wal_fsync_duration_seconds_count:\n%.2000s", body)
	}
	return n
}
