package agentapi

import (
	"net/http"
	"net/netip"
	"strconv"
	"time"
)

// QueryBool is the boolean query parameter name of r (true, false, 1, 0,
// ...), def when it is not given.
func QueryBool(r *http.Request, name string, def bool) (bool, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, invalid("%s=%q: want true or false", name, s)
	}
	return b, nil
}

// QueryDuration is the duration query parameter name of r (a Go duration,
// more than 0 and up to max), def when it is not given: how long a call
// waits.
func QueryDuration(r *http.Request, name string, def, max time.Duration) (time.Duration, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > max {
		return 0, invalid("%s=%q: want a duration up to %s", name, s, max)
	}
	return d, nil
}

// QueryAddrs are the addresses of the query parameter name of r, given
// once or more (?ip=A&ip=B), IPv4-mapped ones unmapped; none when it is
// not given.
func QueryAddrs(r *http.Request, name string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range r.URL.Query()[name] {
		ip, ok := parseAddr(s)
		if !ok {
			return nil, invalid("%s=%q is not an IP address", name, s)
		}
		out = append(out, ip)
	}
	return out, nil
}

// PathAddr is the address of the path wildcard name of r (/v1/ipam/{ip}),
// unmapped.
func PathAddr(r *http.Request, name string) (netip.Addr, error) {
	s := r.PathValue(name)
	ip, ok := parseAddr(s)
	if !ok {
		return netip.Addr{}, invalid("%q is not an IP address", s)
	}
	return ip, nil
}

// parseAddr reads an address without a zone.
func parseAddr(s string) (netip.Addr, bool) {
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}
