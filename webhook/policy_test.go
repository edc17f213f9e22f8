package webhook

import (
	"errors"
	"testing"
)

func TestPolicyCheckURL(t *testing.T) {
	def, _ := ParsePolicy(nil)
	only, err := ParsePolicy([]string{"10.0.0.0/8", "hooks.example.com", "*.corp.example"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		p       *Policy
		url     string
		refused bool // by the policy
		invalid bool // not a usable URL
	}{
		{"loopback by default", def, "http://127.0.0.1:9000/hook", false, false},
		{"public name by default", def, "https://hooks.example.com/x", false, false},
		{"metadata address", def, "http://169.254.169.254/latest/meta-data", true, false},
		{"other link-local", def, "http://169.254.10.1/", true, false},
		{"ipv6 link-local", def, "http://[fe80::1]/", true, false},
		{"mapped metadata", def, "http://[::ffff:169.254.169.254]/", true, false},
		{"gcp metadata name", def, "http://metadata.google.internal/computeMetadata/v1/", true, false},
		{"not http", def, "ftp://example.com/", false, true},
		{"relative", def, "/hook", false, true},
		{"userinfo", def, "http://u:p@example.com/", false, true},
		{"allowed cidr", only, "http://10.1.2.3/hook", false, false},
		{"outside the cidrs", only, "http://127.0.0.1/hook", true, false},
		{"allowed name", only, "https://hooks.example.com/", false, false},
		{"wildcard name", only, "https://a.b.corp.example/", false, false},
		{"name a cidr may admit at dial time", only, "https://unknown.example.org/", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.CheckURL(tc.url)
			switch {
			case tc.refused && !errors.Is(err, ErrRefused):
				t.Errorf("CheckURL(%s) = %v, want a refusal", tc.url, err)
			case tc.invalid && (err == nil || errors.Is(err, ErrRefused)):
				t.Errorf("CheckURL(%s) = %v, want invalid", tc.url, err)
			case !tc.refused && !tc.invalid && err != nil:
				t.Errorf("CheckURL(%s) = %v, want allowed", tc.url, err)
			}
		})
	}
	names, _ := ParsePolicy([]string{"hooks.example.com"})
	if err := names.CheckURL("http://other.example.com/"); !errors.Is(err, ErrRefused) {
		t.Errorf("a name-only policy allowed another name: %v", err)
	}
	if _, err := ParsePolicy([]string{"not a host!"}); err == nil {
		t.Error("ParsePolicy accepted a malformed entry")
	}
}

func TestDialRefusesDeniedAddresses(t *testing.T) {
	def, _ := ParsePolicy(nil)
	ctl := def.dialControl(false)
	if err := ctl("tcp", "169.254.169.254:80", nil); !errors.Is(err, ErrRefused) {
		t.Errorf("dial to the metadata address: %v, want refused", err)
	}
	if err := ctl("tcp", "127.0.0.1:80", nil); err != nil {
		t.Errorf("dial to loopback: %v", err)
	}
}
