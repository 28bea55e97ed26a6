package ipmasq

import (
	"net/netip"
	"strings"
)

// parsePrefix is netip.ParsePrefix with a fast path for the canonical IPv4
// form "a.b.c.d/n" (no leading zeros, no spaces), which is most of a large
// file; anything else goes to netip.ParsePrefix (FuzzParsePrefix checks
// that the two agree).
func parsePrefix(s string) (netip.Prefix, error) {
	if p, ok := parsePrefix4(s); ok {
		return p, nil
	}
	return netip.ParsePrefix(strings.TrimSpace(s))
}

func parsePrefix4(s string) (netip.Prefix, bool) {
	var a [4]byte
	i := 0
	num := func(max int) (int, bool) {
		start, n := i, 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' && i-start < 3 {
			n = n*10 + int(s[i]-'0')
			i++
		}
		if i == start || n > max || (s[start] == '0' && i-start > 1) {
			return 0, false
		}
		return n, true
	}
	for k := range 4 {
		n, ok := num(255)
		if !ok {
			return netip.Prefix{}, false
		}
		a[k] = byte(n)
		sep := byte('.')
		if k == 3 {
			sep = '/'
		}
		if i >= len(s) || s[i] != sep {
			return netip.Prefix{}, false
		}
		i++
	}
	bits, ok := num(32)
	if !ok || i != len(s) {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(netip.AddrFrom4(a), bits), true
}
