package history

import (
	"maps"
	"math"
	"slices"
	"time"
)

// Latencies counts durations in buckets a quarter of a doubling wide: bucket
// 0 holds everything up to 1 ms, bucket i > 0 the durations in
// (2^((i-1)/4), 2^(i/4)] ms. Any number of calls fits in a few dozen
// counters, samples merge by adding (a team's projects, several
// intervals), and a quantile read from them is within about 10 % of the
// exact one: plenty for a chart.
type Latencies map[int]int

// maxBucket is 2^27 ms, about 37 h: longer calls count there.
const maxBucket = 4 * 27

func bucketOf(d time.Duration) int {
	ms := float64(d) / float64(time.Millisecond)
	if ms <= 1 {
		return 0
	}
	return min(int(math.Ceil(4*math.Log2(ms))), maxBucket)
}

// Add counts d.
func (l Latencies) Add(d time.Duration) { l[bucketOf(d)]++ }

// Merge adds o's counts to l.
func (l Latencies) Merge(o Latencies) {
	for b, n := range o {
		l[b] += n
	}
}

// Count is how many durations l holds.
func (l Latencies) Count() int {
	n := 0
	for _, c := range l {
		n += c
	}
	return n
}

// Quantile returns the q-quantile (0 < q ≤ 1) of the durations, nearest
// rank, as the geometric middle of the bucket that holds it (1 ms for
// bucket 0); false when l is empty.
func (l Latencies) Quantile(q float64) (time.Duration, bool) {
	n := l.Count()
	if n == 0 {
		return 0, false
	}
	rank := max(1, int(math.Ceil(q*float64(n))))
	seen := 0
	for _, b := range slices.Sorted(maps.Keys(l)) {
		if seen += l[b]; seen >= rank {
			if b == 0 {
				return time.Millisecond, true
			}
			ms := math.Exp2((float64(b) - 0.5) / 4)
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	return 0, false // not reached: the counts add up to n
}
