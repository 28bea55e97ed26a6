package policymap

import "net/netip"

// SetNodeAddresses makes the API source see addrs as this node's
// addresses, and returns the function that restores the netlink lookup.
func SetNodeAddresses(addrs ...netip.Addr) (restore func()) {
	old := nodeAddresses
	nodeAddresses = func() ([]netip.Addr, error) { return addrs, nil }
	return func() { nodeAddresses = old }
}
