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
// allow entries) allows every destination but link-local addresses and the
// cloud metadata services; a Policy with entries allows only those.
type Policy struct {
	prefixes []netip.Prefix // allowed addresses; none: the default
	names    []string       // allowed host names, lower case; "*.example.com" matches subdomains
}

// deniedByDefault are refused unless an allow entry names them: link-local
// addresses (where cloud metadata services listen, 169.254.169.254) and
// the metadata addresses outside that range.
var deniedByDefault = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS IMDS over IPv6
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
}

// deniedNames are metadata host names refused by default.
var deniedNames = []string{"metadata.google.internal", "metadata.goog", "metadata"}

// ErrRefused is wrapped by every refusal of a destination.
var ErrRefused = errors.New("webhook destination not allowed")

// ParsePolicy reads the entries of webhook.allow: CIDRs, single addresses
// and host names (a leading "*." matches every subdomain).
func ParsePolicy(entries []string) (*Policy, error) {
	p := &Policy{}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if pfx, err := netip.ParsePrefix(e); err == nil {
			p.prefixes = append(p.prefixes, pfx.Masked())
			continue
		}
		if a, err := netip.ParseAddr(e); err == nil {
			p.prefixes = append(p.prefixes, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		if !validName(strings.TrimPrefix(e, "*.")) {
			return nil, fmt.Errorf("webhook.allow entry %q is neither a CIDR, an address nor a host name", e)
		}
		p.names = append(p.names, strings.ToLower(e))
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

func (p *Policy) explicit() bool { return len(p.prefixes) > 0 || len(p.names) > 0 }

// nameAllowed reports whether host (lower case, not an address) is allowed
// by name: listed, or, by default, anything but a metadata name.
func (p *Policy) nameAllowed(host string) bool {
	host = strings.TrimSuffix(host, ".")
	if !p.explicit() {
		for _, n := range deniedNames {
			if host == n {
				return false
			}
		}
		return true
	}
	for _, n := range p.names {
		if n == host || strings.HasPrefix(n, "*.") && strings.HasSuffix(host, n[1:]) {
			return true
		}
	}
	return false
}

// addrAllowed reports whether a is an allowed destination address.
func (p *Policy) addrAllowed(a netip.Addr) bool {
	a = a.Unmap()
	if !p.explicit() {
		for _, d := range deniedByDefault {
			if d.Contains(a) {
				return false
			}
		}
		return true
	}
	for _, pfx := range p.prefixes {
		if pfx.Contains(a) {
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
		if !p.addrAllowed(a) {
			return fmt.Errorf("%w: %s (see webhook.allow)", ErrRefused, host)
		}
		return nil
	}
	if p.nameAllowed(host) || len(p.prefixes) > 0 {
		return nil
	}
	return fmt.Errorf("%w: %s (see webhook.allow)", ErrRefused, host)
}

// dialControl refuses a connection to an address the policy does not allow,
// unless the URL's host was allowed by name (byName). It runs for every
// address a dial tries, after name resolution.
func (p *Policy) dialControl(byName bool) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		if byName {
			return nil
		}
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: %s", ErrRefused, address)
		}
		if !p.addrAllowed(ap.Addr()) {
			return fmt.Errorf("%w: %s", ErrRefused, ap.Addr())
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
	return d.DialContext(ctx, network, addr)
}

// allowedByName reports whether the URL's host is an explicitly allowed
// name, which the dial then trusts whatever it resolves to.
func (p *Policy) allowedByName(u *url.URL) bool {
	host := strings.ToLower(u.Hostname())
	if _, err := netip.ParseAddr(host); err == nil || !p.explicit() {
		return false
	}
	return p.nameAllowed(host)
}
