package metrics

import "testing"

func TestWithNodeAddsTheFirstLabel(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`a 1`, `a{node="n"} 1`},
		{`a{} 1`, `a{node="n"} 1`},
		{`a{b="x y{"} 2`, `a{node="n",b="x y{"} 2`},
		{`a_bucket{le="+Inf"} 3 1700000000`, `a_bucket{node="n",le="+Inf"} 3 1700000000`},
	} {
		if got := withNode(tc.in, "n"); got != tc.want {
			t.Errorf("withNode(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
