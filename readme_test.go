package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestREADMESaysWhatIsTrue holds the README to what the code and the other
// docs say in two places a reader acts on at once.
func TestREADMESaysWhatIsTrue(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	readme := read("README.md")

	// The Banana 6.x API class takes no URL: the README points it at inferd
	// the way the end-to-end test of the real npm client does.
	set := regexp.MustCompile(`\b[a-z]+\.(baseUrl) = `)
	js := set.FindStringSubmatch(read("examples/banana-js/clients.test.js"))
	if js == nil {
		t.Fatal("examples/banana-js/clients.test.js no longer sets the API class's URL: update this test")
	}
	section := readme[strings.Index(readme, "## Coming from Banana"):]
	if m := set.FindStringSubmatch(section); m == nil || m[1] != js[1] {
		t.Errorf("README's Coming from Banana does not show setting %s as clients.test.js does", js[1])
	}

	// Until docs/gpu.md has a run on real hardware to show, the README says
	// the GPU path has not had one.
	if strings.Contains(read("docs/gpu.md"), "none of this has been run on real hardware") &&
		!strings.Contains(readme, "has not yet run on real hardware") {
		t.Error("README presents GPU pinning as working, while docs/gpu.md says it has never run on real hardware")
	}
}
