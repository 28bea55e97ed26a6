package allocator

import (
	"net/netip"
	"strconv"

	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/ipamapi"
)

// AllocationResult is what an allocation returns (ipamapi).
type AllocationResult = ipamapi.AllocationResult

// NewResult builds the allocation result of ip on eni, with the
// native-routing and the non-masquerade CIDRs in effect.
func NewResult(ip netip.Addr, eni *ciliumnode.ENI, nativeRouting, nonMasq []netip.Prefix) AllocationResult {
	cidrs := ciliumnode.ResultCIDRs(eni, ipamapi.FamilyOf(ip), nativeRouting, nonMasq)
	r := AllocationResult{
		IP:              ip.String(),
		Gateway:         eni.Gateway.String(),
		CIDRs:           make([]string, len(cidrs)),
		MasterMAC:       eni.MAC,
		InterfaceNumber: strconv.Itoa(eni.Number),
	}
	for i, p := range cidrs {
		r.CIDRs[i] = p.String()
	}
	return r
}
