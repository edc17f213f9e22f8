package webhook

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
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

// The forbidden destinations stay refused whatever webhook.allow says, in
// every form that reaches them: IPv4-mapped, IPv4-compatible and NAT64
// IPv6, a link-local address with a zone, the metadata names.
func TestForbiddenDestinationsWhateverTheAllowList(t *testing.T) {
	def, _ := ParsePolicy(nil)
	names, _ := ParsePolicy([]string{"*.example", "*.internal"})
	everything, err := ParsePolicy([]string{"0.0.0.0/0", "::/0"})
	if err != nil {
		t.Fatal(err)
	}
	forbiddenHosts := []string{
		"169.254.169.254", "[::ffff:169.254.169.254]", "[::ffff:a9fe:a9fe]", "[::a9fe:a9fe]",
		"[64:ff9b::a9fe:a9fe]", "[64:ff9b::169.254.169.254]", "[64:ff9b:1::a9fe:a9fe]",
		"[fe80::1%25eth0]", "[fd00:ec2::254]", "100.100.100.200", "[64:ff9b::6464:64c8]",
		"metadata.google.internal", "METADATA.GOOGLE.INTERNAL.",
	}
	for pname, p := range map[string]*Policy{"default": def, "names": names, "everything": everything} {
		for _, host := range forbiddenHosts {
			// Refused whatever webhook.allow says: the refusal says so, and
			// does not send the user to webhook.allow.
			err := p.CheckURL("http://" + host + "/latest/meta-data/")
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "no webhook may reach") ||
				!strings.Contains(err.Error(), "webhook.allow cannot allow") || strings.Contains(err.Error(), "see webhook.allow") {
				t.Errorf("%s policy: CheckURL(%s) = %v, want refused as never reachable", pname, host, err)
			}
		}
		for _, byName := range []bool{false, true} {
			ctl := p.dialControl(byName)
			for _, addr := range []string{"169.254.169.254:80", "[::ffff:169.254.169.254]:80", "[::a9fe:a9fe]:80",
				"[64:ff9b::a9fe:a9fe]:80", "[fe80::1%eth0]:80", "[fd00:ec2::254]:80", "100.100.100.200:80"} {
				if err := ctl("tcp", addr, nil); !errors.Is(err, ErrRefused) {
					t.Errorf("%s policy, allowed by name %t: dial %s = %v, want refused", pname, byName, addr, err)
				}
			}
		}
	}
	// The IPv6 forms of other addresses are the addresses they carry.
	tenNet, _ := ParsePolicy([]string{"10.0.0.0/8"})
	for p, allowed := range map[*Policy][]string{
		def:    {"[64:ff9b::808:808]", "[::1]", "[::ffff:127.0.0.1]", "[2001:db8::1]"},
		tenNet: {"[64:ff9b::a01:203]", "[::ffff:10.1.2.3]"},
	} {
		for _, host := range allowed {
			if err := p.CheckURL("http://" + host + "/"); err != nil {
				t.Errorf("CheckURL(%s) = %v, want allowed", host, err)
			}
		}
	}
	if err := tenNet.CheckURL("http://[64:ff9b::b01:203]/"); !errors.Is(err, ErrRefused) {
		t.Errorf("NAT64 of 11.1.2.3 with only 10.0.0.0/8 allowed: %v, want refused", err)
	}
}

// An allow entry that could only name forbidden destinations is a
// configuration error, not an entry that silently never works.
func TestAllowEntriesInsideForbiddenRangesAreRejected(t *testing.T) {
	for _, e := range []string{"169.254.169.254", "169.254.0.0/16", "169.254.169.0/24", "::ffff:169.254.169.254",
		"64:ff9b::a9fe:a9fe", "fe80::/64", "metadata.google.internal"} {
		if _, err := ParsePolicy([]string{e}); err == nil {
			t.Errorf("ParsePolicy accepted %q", e)
		}
	}
	if _, err := ParsePolicy([]string{"169.0.0.0/8", "10.0.0.0/8", "*.google.internal"}); err != nil {
		t.Errorf("entries wider than a forbidden range: %v", err)
	}
}

// #27's reproduction: with an allow-list entry *.example, a name under it
// that resolves to the metadata address (or to its NAT64 form) is refused
// when it is dialed, the address checked being the one resolved; a name
// under it that resolves elsewhere is reached.
func TestAllowListedNameResolvingToMetadataIsRefusedAtDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	testHosts = map[string]string{"meta.example": "169.254.169.254", "nat.example": "64:ff9b::a9fe:a9fe", "ok.example": "127.0.0.1"}
	defer func() { testHosts = nil }()

	p, err := ParsePolicy([]string{"*.example"})
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"meta.example", "nat.example", "ok.example"} {
		u, _ := url.Parse("http://" + host + ":" + port + "/hook")
		if err := p.CheckURL(u.String()); err != nil || !p.allowedByName(u) {
			t.Fatalf("%s: CheckURL %v, allowed by name %t; want allowed by name", host, err, p.allowedByName(u))
		}
		ctx := context.WithValue(context.Background(), byNameKey{}, p.allowedByName(u))
		conn, err := p.dialContext(ctx, "tcp", u.Host)
		if conn != nil {
			conn.Close()
		}
		switch {
		case host == "ok.example" && err != nil:
			t.Errorf("dial %s (127.0.0.1): %v, want connected", host, err)
		case host != "ok.example" && !errors.Is(err, ErrRefused):
			t.Errorf("dial %s: %v, want refused", host, err)
		}
	}
}
