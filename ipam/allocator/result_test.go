package allocator

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/ipamtest"
)

func TestSampleAllocationResult(t *testing.T) {
	n, nonMasq := ipamtest.Samples(t)
	pool := ciliumnode.NewPool(n.ENIs)
	ip := netip.MustParseAddr("10.130.100.133")
	eni, ok := pool.ENI(ip)
	if !ok {
		t.Fatalf("%s not in the pool", ip)
	}
	got := NewResult(ip, eni, nil, nonMasq)
	want := AllocationResult{
		IP:      "10.130.100.133",
		Gateway: "10.130.96.1",
		// The VPC CIDRs 10.128.0.0/13 and 100.112.0.0/13 are inside
		// 10.0.0.0/8 and 100.64.0.0/10; fe80::/10 is IPv6.
		CIDRs:           []string{"10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"},
		MasterMAC:       "0a:58:0a:82:64:0a",
		InterfaceNumber: "1",
	}
	if !slices.Equal(got.CIDRs, want.CIDRs) || got.IP != want.IP || got.Gateway != want.Gateway ||
		got.MasterMAC != want.MasterMAC || got.InterfaceNumber != want.InterfaceNumber {
		t.Errorf("result\n got %+v\nwant %+v", got, want)
	}

	// Without the ip-masq-agent: the VPC CIDRs and the native routing CIDR.
	got = NewResult(ip, eni, ipamtest.Prefixes(t, "10.130.0.0/16"), nil)
	if want := []string{"10.128.0.0/13", "100.112.0.0/13"}; !slices.Equal(got.CIDRs, want) {
		t.Errorf("without ip-masq-agent: %v, want %v (10.130.0.0/16 is inside the VPC)", got.CIDRs, want)
	}
	got = NewResult(ip, eni, ipamtest.Prefixes(t, "10.200.0.0/16"), nil)
	if want := []string{"10.128.0.0/13", "10.200.0.0/16", "100.112.0.0/13"}; !slices.Equal(got.CIDRs, want) {
		t.Errorf("native routing CIDR: %v, want %v", got.CIDRs, want)
	}
}

func TestPlacementOfAnIPOutsideThePool(t *testing.T) {
	n, _ := ipamtest.Samples(t)
	pool := ciliumnode.NewPool(n.ENIs)
	eni, state, reason := placement(pool, &allocations.Allocation{IP: netip.MustParseAddr("10.130.0.10")})
	if eni != "" || state != allocations.StateOrphaned || !strings.Contains(reason, "not in spec.ipam.pool") {
		t.Errorf("placement of ENI 0's IP: %q %q %q", eni, state, reason)
	}
}
