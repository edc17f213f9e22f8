package bolt

import (
	"testing"
)

func BenchmarkProjectByModelKey(b *testing.B) {
	s := openTest(b)
	if _, err := s.PutProject(testProject("p", "t")); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ProjectByModelKey("key-p"); err != nil {
			b.Fatal(err)
		}
	}
}
