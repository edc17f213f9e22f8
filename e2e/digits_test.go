package e2e

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// digitSamples are images 0, 7 and 13 of sklearn's bundled 8x8 digits, with
// their labels: the model trains on them, so it must get them right.
var digitSamples = []struct {
	label  int
	pixels string
}{
	{0, "[0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0]"},
	{7, "[0,0,7,8,13,16,15,1,0,0,7,7,4,11,12,0,0,0,0,0,8,13,1,0,0,4,8,8,15,15,6,0,0,2,11,15,15,4,0,0,0,0,0,16,5,0,0,0,0,0,9,15,1,0,0,0,0,0,13,5,0,0,0,0]"},
	{3, "[0,2,9,15,14,9,3,0,0,4,13,8,9,16,8,0,0,0,0,6,14,15,3,0,0,0,0,11,14,2,0,0,0,0,0,2,15,11,0,0,0,0,0,0,2,15,4,0,0,1,5,6,13,16,6,0,0,2,12,12,13,11,0,0]"},
}

// TestDigitsModelEndToEnd applies examples/digits/project.yaml as shipped and
// classifies digits through inferd: a real PyTorch cold boot (training at
// start) and real forward passes. It needs Debian's python3-torch and
// python3-sklearn for /usr/bin/python3; `make test` installs them and sets
// INFERD_REQUIRE_CLIENT_TESTS=1, so there this test cannot skip.
func TestDigitsModelEndToEnd(t *testing.T) {
	t.Parallel()
	const python = "/usr/bin/python3" // what the manifest names
	if out, err := exec.Command(python, "-c", "import torch, sklearn").CombinedOutput(); err != nil {
		reason := fmt.Sprintf("%s cannot import torch and sklearn (%v: %s)", python, err, strings.TrimSpace(string(out)))
		testenv.Missing(t, "%s; install python3-torch and python3-sklearn (scripts/test-deps.sh does)", reason)
	}
	manifest := shippedManifest(t, "examples/digits/project.yaml")
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(2*time.Minute)+"\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("demo", false)
	if out, err := d.cli("apply", "-f", manifest); err != nil || !strings.Contains(out, "project digits (team demo): created") {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	c := inferenceClient{t: t, base: d.base, key: key}

	t.Run("the first call boots the model and classifies", func(t *testing.T) {
		r := c.start("mk-digits-1", `{"pixels":`+digitSamples[0].pixels+`}`, false)
		if r["message"] != "success" {
			t.Fatalf("start: %v", r)
		}
		out := output(t, r)
		if out["digit"] != 0.0 || out["device"] != "cpu" {
			t.Fatalf("reply %v, want digit 0 on cpu", out)
		}
		if probs, _ := out["probabilities"].([]any); len(probs) != 10 {
			t.Errorf("probabilities %v, want 10", out["probabilities"])
		}
		t.Logf("cold call: bootMs %v, runMs %v", r["bootMs"], r["runMs"])
		// The daemon logged this before it answered, but the line still has
		// to come through the stderr pipe and the harness's reader, which a
		// loaded box can hold up for more than a second.
		t.Logf("boot: %s", d.logs.waitFor(t, `"replica ready"`, 30*time.Second))
	})
	t.Run("warm calls classify single images and batches", func(t *testing.T) {
		var images []string
		var want []float64
		for _, s := range digitSamples {
			r := c.start("mk-digits-1", `{"pixels":`+s.pixels+`}`, false)
			if r["message"] != "success" || output(t, r)["digit"] != float64(s.label) {
				t.Errorf("digit %d: %v", s.label, r)
			}
			t.Logf("warm call (digit %d): runMs %v", s.label, r["runMs"])
			images = append(images, s.pixels)
			want = append(want, float64(s.label))
		}
		r := c.start("mk-digits-1", `{"images":[`+strings.Join(images, ",")+`]}`, false)
		var got []float64
		if r["message"] == "success" {
			for _, v := range output(t, r)["digits"].([]any) {
				got = append(got, v.(float64))
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("batch: %v, want digits %v", r, want)
		}
	})
	t.Run("a malformed image fails the call with the model's reason", func(t *testing.T) {
		r := c.start("mk-digits-1", `{"pixels":[1,2,3]}`, false)
		want := "error: model returned an error for this call: " // the project batches
		if msg, _ := r["message"].(string); !strings.HasPrefix(msg, want) || !strings.Contains(msg, "want a list of 64 numbers") {
			t.Fatalf("message %v, want %q and the shape", r["message"], want)
		}
	})
	t.Run("calls that come together share forward passes, each answered with its own digit", func(t *testing.T) {
		const n = 24
		results := make(chan error, n)
		var sizes sync.Map
		for i := range n {
			s := digitSamples[i%len(digitSamples)]
			go func() {
				r, err := c.tryStart("mk-digits-1", `{"pixels":`+s.pixels+`}`, false)
				if err == nil {
					var out map[string]any
					if out, err = outputOf(r); err == nil && out["digit"] != float64(s.label) {
						err = fmt.Errorf("digit %d classified as %v", s.label, out["digit"])
					}
					sizes.Store(i, r["batchSize"])
				}
				results <- err
			}()
		}
		for range n {
			if err := <-results; err != nil {
				t.Error(err)
			}
		}
		var seen []any
		sizes.Range(func(_, v any) bool {
			if v == nil {
				t.Errorf("a call's answer has no batchSize: it did not go through the batch path")
			}
			seen = append(seen, v)
			return true
		})
		t.Logf("batch sizes of %d concurrent calls: %v", n, seen)
	})
}
