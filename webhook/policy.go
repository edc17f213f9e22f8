package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
)

// Policy is the set of destinations webhooks may have. The zero Policy (no
// allow entries) allows every destination but the forbidden ones; a Policy
// with entries allows only those, and never a forbidden one.
type Policy struct {
	prefixes []netip.Prefix // allowed addresses; none: the default
	names    []string       // allowed host names, lower case; "*.example.com" matches subdomains
}

// forbidden are the addresses no webhook may reach, whatever webhook.allow
// says: link-local addresses (where cloud metadata services listen,
// 169.254.169.254) and the metadata addresses outside that range. An allow
// entry widens the names and networks a webhook may reach, never these: a
// client that may name a receiver must not be able to read the box's cloud
// credentials through it.
var forbidden = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS IMDS over IPv6
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
}

// forbiddenNames are the metadata host names, refused like the addresses.
var forbiddenNames = []string{"metadata.google.internal", "metadata.goog", "metadata"}

// IPv6 forms that reach an IPv4 host: the address they carry in their last
// 32 bits is the one checked (carriedIPv4).
var (
	ipv4Compatible = netip.MustParsePrefix("::/96")          // ::a.b.c.d, deprecated but still routed by some stacks
	nat64          = netip.MustParsePrefix("64:ff9b::/96")   // RFC 6052 well-known prefix
	nat64Local     = netip.MustParsePrefix("64:ff9b:1::/48") // RFC 8215 local use, taken with the /96 embedding
)

// ErrRefused is wrapped by every refusal of a destination.
var ErrRefused = errors.New("webhook destination not allowed")

// ParsePolicy reads the entries of webhook.allow: CIDRs, single addresses
// and host names (a leading "*." matches every subdomain). An entry that
// only names forbidden destinations is an error rather than an entry that
// silently never works.
func ParsePolicy(entries []string) (*Policy, error) {
	p := &Policy{}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		pfx, err := netip.ParsePrefix(e)
		if a, aerr := netip.ParseAddr(e); aerr == nil {
			a = a.Unmap().WithZone("")
			pfx, err = netip.PrefixFrom(a, a.BitLen()), nil
		}
		if err == nil {
			pfx = pfx.Masked()
			if inside := forbiddenPrefix(pfx); inside.IsValid() {
				return nil, fmt.Errorf("webhook.allow entry %q is inside %s, which no webhook may reach (link-local and cloud metadata addresses)", e, inside)
			}
			p.prefixes = append(p.prefixes, pfx)
			continue
		}
		if !validName(strings.TrimPrefix(e, "*.")) {
			return nil, fmt.Errorf("webhook.allow entry %q is neither a CIDR, an address nor a host name", e)
		}
		name := strings.ToLower(strings.TrimSuffix(e, "."))
		if forbiddenName(name) {
			return nil, fmt.Errorf("webhook.allow entry %q is a cloud metadata name, which no webhook may reach", e)
		}
		p.names = append(p.names, name)
	}
	return p, nil
}

func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// forbiddenPrefix returns the forbidden range that holds all of pfx (a
// single address is checked as the IPv4 it carries too), or the zero
// Prefix.
func forbiddenPrefix(pfx netip.Prefix) netip.Prefix {
	if pfx.IsSingleIP() {
		return forbiddenRange(pfx.Addr())
	}
	for _, f := range forbidden {
		if f.Bits() <= pfx.Bits() && f.Contains(pfx.Addr()) {
			return f
		}
	}
	return netip.Prefix{}
}

// carriedIPv4 returns the IPv4 address that a reaches: a itself, or the
// IPv4 address an IPv4-mapped, IPv4-compatible or NAT64 IPv6 address
// carries. The unspecified and loopback IPv6 addresses carry none.
func carriedIPv4(a netip.Addr) netip.Addr {
	a = a.WithZone("").Unmap()
	if !a.Is6() || a == netip.IPv6Unspecified() || a == netip.IPv6Loopback() {
		return a
	}
	if ipv4Compatible.Contains(a) || nat64.Contains(a) || nat64Local.Contains(a) {
		b := a.As16()
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return a
}

// forbiddenRange returns the forbidden range that a, or the IPv4 address
// it carries, is in, or the zero Prefix. A zone (fe80::1%eth0) does not
// take an address out of its range.
func forbiddenRange(a netip.Addr) netip.Prefix {
	for _, x := range []netip.Addr{a.WithZone("").Unmap(), carriedIPv4(a)} {
		for _, f := range forbidden {
			if f.Contains(x) {
				return f
			}
		}
	}
	return netip.Prefix{}
}

// forbiddenName reports whether host (lower case, no trailing dot) is a
// metadata name.
func forbiddenName(host string) bool {
	for _, n := range forbiddenNames {
		if host == n {
			return true
		}
	}
	return false
}

func (p *Policy) explicit() bool { return len(p.prefixes) > 0 || len(p.names) > 0 }

// nameAllowed reports whether host (lower case, not an address) is allowed
// by name: never a metadata name; by default every other name, else a
// listed one.
func (p *Policy) nameAllowed(host string) bool {
	host = strings.TrimSuffix(host, ".")
	if forbiddenName(host) {
		return false
	}
	if !p.explicit() {
		return true
	}
	for _, n := range p.names {
		if n == host || strings.HasPrefix(n, "*.") && strings.HasSuffix(host, n[1:]) {
			return true
		}
	}
	return false
}

// addrAllowed reports whether a is an allowed destination address: never
// a forbidden one (nor an IPv6 form of one); by default every other
// address, else one in a listed network.
func (p *Policy) addrAllowed(a netip.Addr) bool {
	if forbiddenRange(a).IsValid() {
		return false
	}
	if !p.explicit() {
		return true
	}
	a = a.WithZone("").Unmap()
	v4 := carriedIPv4(a)
	for _, pfx := range p.prefixes {
		if pfx.Contains(a) || pfx.Contains(v4) {
			return true
		}
	}
	return false
}

// CheckURL refuses a webhook URL that is not an absolute http(s) URL, or
// whose host is refused. A host name that only an allowed CIDR could admit
// passes here and is checked when it is dialed.
func (p *Policy) CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("webhook must be an http or https URL")
	}
	if u.User != nil {
		return fmt.Errorf("webhook URL must not carry a user or password")
	}
	host := strings.ToLower(u.Hostname())
	if a, err := netip.ParseAddr(host); err == nil {
		if never := forbiddenRange(a); never.IsValid() {
			return fmt.Errorf("%w: %s is in %s, which no webhook may reach (link-local and cloud metadata addresses; webhook.allow cannot allow them)", ErrRefused, host, never)
		}
		if !p.addrAllowed(a) {
			return fmt.Errorf("%w: %s (see webhook.allow)", ErrRefused, host)
		}
		return nil
	}
	if forbiddenName(strings.TrimSuffix(host, ".")) {
		return fmt.Errorf("%w: %s is a cloud metadata name, which no webhook may reach (webhook.allow cannot allow it)", ErrRefused, host)
	}
	if p.nameAllowed(host) || len(p.prefixes) > 0 {
		return nil
	}
	return fmt.Errorf("%w: %s (see webhook.allow)", ErrRefused, host)
}

// dialControl refuses a connection to an address the policy does not
// allow. It runs for every address a dial tries, after name resolution, so
// it sees the address actually connected to: a name that resolves (or
// rebinds) to a forbidden address is refused whatever webhook.allow says.
// A URL host allowed by name (byName) may reach any other address.
func (p *Policy) dialControl(byName bool) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: %s", ErrRefused, address)
		}
		a := ap.Addr()
		if f := forbiddenRange(a); f.IsValid() {
			return fmt.Errorf("%w: %s is in %s (link-local and cloud metadata addresses are never reached)", ErrRefused, a, f)
		}
		if !byName && !p.addrAllowed(a) {
			return fmt.Errorf("%w: %s", ErrRefused, a)
		}
		return nil
	}
}

// byNameKey marks a request whose host the policy allows by name.
type byNameKey struct{}

// dialContext dials with the policy's check on the address dialed.
func (p *Policy) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	byName, _ := ctx.Value(byNameKey{}).(bool)
	d := net.Dialer{Control: p.dialControl(byName)}
	return d.DialContext(ctx, network, testResolve(addr))
}

// allowedByName reports whether the URL's host is an explicitly allowed
// name, which the dial then lets reach any address but a forbidden one.
func (p *Policy) allowedByName(u *url.URL) bool {
	host := strings.ToLower(u.Hostname())
	if _, err := netip.ParseAddr(host); err == nil || !p.explicit() {
		return false
	}
	return p.nameAllowed(host)
}

// testHosts, set only in test builds (failpoint.go), maps host names to the
// addresses a dial resolves them to, so that an end-to-end test can give a
// name a metadata address without touching the system's resolver.
var testHosts map[string]string

// testResolve replaces addr's host by its testHosts address, if any.
func testResolve(addr string) string {
	if testHosts == nil {
		return addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if a, ok := testHosts[strings.ToLower(host)]; ok {
		return net.JoinHostPort(a, port)
	}
	return addr
}
