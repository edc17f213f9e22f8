package bolt

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"inferd/internal/testenv"
)

// A daemon reopening a large data file must not carry the whole file in its RSS:
// opening rebuilds the freelist by reading every page, and those pages are let go.
func TestOpenDoesNotKeepTheFileMapped(t *testing.T) {
	path := testPath(t)
	s := openAt(t, path, Options{})
	// About 12 MiB of small records, spread over many leaf pages, as stored calls are.
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket([]byte("filler"))
		if err != nil {
			return err
		}
		val := []byte(strings.Repeat("x", 100))
		for i := range 100_000 {
			if err := b.Put(fmt.Appendf(nil, "key-%08d", i), val); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}

	s = openAt(t, path, Options{})
	rss := mappedRSS(t, path)
	t.Logf("file %d KiB, mapped and resident after open %d KiB", fi.Size()>>10, rss>>10)
	if rss > fi.Size()/4 {
		t.Errorf("after Open, %d KiB of the %d KiB file count in RSS; want under a quarter", rss>>10, fi.Size()>>10)
	}
	// Reads still work: the pages come back from the page cache.
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket([]byte("filler")).Get([]byte("key-00099999")); len(v) != 100 {
			return fmt.Errorf("last record = %q", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// mappedRSS sums the resident size of this process's mappings of path, from
// /proc/self/smaps.
func mappedRSS(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		testenv.Missing(t, "/proc/self/smaps: %v", err)
	}
	defer f.Close()
	var total int64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = len(fields) >= 6 && fields[5] == path
			continue
		}
		if in && len(fields) == 3 && fields[0] == "Rss:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				t.Fatalf("smaps line %q: %v", line, err)
			}
			total += kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}
