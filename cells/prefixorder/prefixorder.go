// Package prefixorder is the one order of prefixes that every table, map
// listing and compiled value of enimasq uses: by address (IPv4 before
// IPv6), then by length, so that a prefix and the prefixes inside it sort
// together, as `ip rule` and `bpftool` readers expect. (netip.Prefix.Compare
// orders by length first.)
package prefixorder

import (
	"cmp"
	"net/netip"
)

// Compare orders a and b by address, then by length.
func Compare(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}
