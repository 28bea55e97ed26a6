package netlinkfake

import (
	"net"
	"net/netip"

	"go4.org/netipx"
	"golang.org/x/sys/unix"
)

// prefixOf is n as a prefix, IPv4 unmapped (invalid for nil), as the
// kernel's dump reads.
func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	p, _ := netipx.FromStdIPNet(n)
	return netip.PrefixFrom(p.Addr().Unmap(), p.Bits())
}

func familyOf(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// wake signals ch without blocking: one pending signal covers a burst.
func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
