package allocator

import (
	"net/netip"
	"time"
)

// Settings are what the allocator takes (validated by the ipam cell, which
// owns the flags).
type Settings struct {
	// Off, when set, says why enimasq does not allocate (another IPAM does,
	// or the IPAM mode is not ENI): no allocator, API or checkpoint.
	Off string
	// EnableIPv4 and EnableIPv6 are the families the node runs.
	EnableIPv4, EnableIPv6 bool
	// NativeRouting are --ipv4/ipv6-native-routing-cidr (invalid when
	// unset): CIDRs of every allocation result.
	NativeRouting []netip.Prefix
	// CiliumNodeSource names where the CiliumNode is read from, for errors.
	CiliumNodeSource string
	// CiliumNodeResync is how often the CiliumNode's status.ipam.used is
	// written again, and the checkpoint restore retried.
	CiliumNodeResync time.Duration
}
