package main

import (
	"net/netip"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
)

// A veth is an attachment's when it routes one of the IPs the attachment
// holds: not another IP, not via another link.
func TestPodRoutesRoutesAny(t *testing.T) {
	routes := podRoutes{
		netip.MustParseAddr("10.130.100.133"): {7},
		netip.MustParseAddr("fd00::5"):        {9, 7},
	}
	for _, tc := range []struct {
		index int
		ips   []string
		want  bool
	}{
		{7, []string{"10.130.100.133"}, true},
		{7, []string{"10.130.100.134", "10.130.100.133"}, true},
		{8, []string{"10.130.100.133"}, false},
		{7, []string{"10.130.100.134"}, false},
		{7, nil, false},
		{7, []string{"fd00::5"}, true},
		{7, []string{"::ffff:10.130.100.133"}, true},
		{7, []string{"not an IP"}, false},
	} {
		if got := routes.routesAny(tc.index, tc.ips); got != tc.want {
			t.Errorf("routesAny(%d, %v) = %v, want %v", tc.index, tc.ips, got, tc.want)
		}
	}
}

// The prevResult names the veth when its host-side interface (no sandbox)
// has the veth's name and MAC: not the pod side, not a veth made again.
func TestNamedByResult(t *testing.T) {
	prev := &current.Result{Interfaces: []*current.Interface{
		{Name: "lxc0123456789a", Mac: "AA:bb:cc:dd:ee:01"},
		{Name: "eth0", Mac: "aa:bb:cc:dd:ee:02", Sandbox: "/var/run/netns/pod"},
		nil,
	}}
	for _, tc := range []struct {
		prev      *current.Result
		name, mac string
		want      bool
	}{
		{prev, "lxc0123456789a", "aa:bb:cc:dd:ee:01", true},
		{prev, "lxc0123456789a", "aa:bb:cc:dd:ee:03", false},
		{prev, "lxc0123456789b", "aa:bb:cc:dd:ee:01", false},
		{prev, "eth0", "aa:bb:cc:dd:ee:02", false},
		{prev, "lxc0123456789a", "", false},
		{nil, "lxc0123456789a", "aa:bb:cc:dd:ee:01", false},
	} {
		if got := namedByResult(tc.prev, tc.name, tc.mac); got != tc.want {
			t.Errorf("namedByResult(%s, %s) = %v, want %v", tc.name, tc.mac, got, tc.want)
		}
	}
}
