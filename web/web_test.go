package web

import (
	"io/fs"
	"strings"
	"testing"
)

// The sign-in hint gives the commands as they must be typed from a
// checkout (./inferd, --config), and the packaged service's form.
func TestSignInHintShowsTheCommandAsTyped(t *testing.T) {
	page, err := fs.ReadFile(Files(), "index.html")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"./inferd --config CONFIG key create --team TEAM",
		"./inferd --config CONFIG key create --admin ",
		"sudo -u inferd inferd --config /etc/inferd/config.yaml key create",
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the sign-in hint lacks %q", want)
		}
	}
}
