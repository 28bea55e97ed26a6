package ipamapi

import "net/netip"

// The address families of a Request, as they are spelled on the wire.
const (
	FamilyIPv4 = "ipv4"
	FamilyIPv6 = "ipv6"
)

// FamilyOf is the family of addr, as a Request spells it.
func FamilyOf(addr netip.Addr) string {
	if addr.Is4() {
		return FamilyIPv4
	}
	return FamilyIPv6
}
