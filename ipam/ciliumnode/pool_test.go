package ciliumnode_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/ipamapi"
	"github.com/enimasq/enimasq/ipam/ipamtest"
)

func TestCoalesceCIDRs(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
	}{
		{nil, nil},
		{[]string{"10.0.0.0/8", "10.128.0.0/13", "10.0.0.0/8"}, []string{"10.0.0.0/8"}},
		{[]string{"10.128.0.0/13", "10.0.0.0/8"}, []string{"10.0.0.0/8"}},
		{[]string{"10.1.2.3/8"}, []string{"10.0.0.0/8"}},
		{[]string{"0.0.0.0/0", "192.168.0.0/16", "fe80::/10"}, []string{"0.0.0.0/0", "fe80::/10"}},
		// Adjacent prefixes merge, as Cilium's ip.CoalesceCIDRs (and so
		// cilium-cni) does.
		{[]string{"192.168.1.0/24", "192.168.0.0/24", "172.16.0.0/12"}, []string{"172.16.0.0/12", "192.168.0.0/23"}},
		{[]string{"10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24"}, []string{"10.0.0.0/23", "10.0.2.0/24"}},
		{[]string{"10.0.0.0/16", "10.1.0.0/16"}, []string{"10.0.0.0/15"}},
		{[]string{"::/0", "10.0.0.0/8"}, []string{"10.0.0.0/8", "::/0"}},
	} {
		got := ciliumnode.CoalesceCIDRs(ipamtest.Prefixes(t, tc.in...))
		var gotS []string
		for _, p := range got {
			gotS = append(gotS, p.String())
		}
		if !slices.Equal(gotS, tc.want) {
			t.Errorf("ciliumnode.CoalesceCIDRs(%v) = %v, want %v", tc.in, gotS, tc.want)
		}
	}
}

func TestPoolNextAndPlacement(t *testing.T) {
	n, _ := ipamtest.Samples(t)
	pool := ciliumnode.NewPool(n.ENIs)
	var got []string
	taken := map[netip.Addr]bool{}
	for {
		ip, ok := pool.Next(ipamapi.FamilyIPv4, func(ip netip.Addr) bool { return taken[ip] })
		if !ok {
			break
		}
		taken[ip] = true
		got = append(got, ip.String())
	}
	want := []string{"10.130.100.133", "10.130.100.134", "10.130.100.135", "10.130.112.20", "10.130.112.21"}
	if !slices.Equal(got, want) {
		t.Errorf("allocation order %v, want %v", got, want)
	}
	if _, ok := pool.Next(ipamapi.FamilyIPv6, func(netip.Addr) bool { return false }); ok {
		t.Error("an IPv6 address from an IPv4 pool")
	}
}
