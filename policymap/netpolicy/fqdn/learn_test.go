package fqdn

import (
	"net/netip"
	"testing"
	"time"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

func TestMerge(t *testing.T) {
	pod := netip.MustParseAddr("10.0.0.2")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	row := &endpoints.DNSName{Pod: pod, PodName: "ns/a", Name: "a.example.com", Rules: []string{"r"},
		IPs: []endpoints.NameIP{{IP: netip.MustParseAddr("192.0.2.1"), Expires: t0.Add(30 * time.Second)}}}

	// The same address, expiry pushed out by less than the slack: nothing
	// to write.
	if next, _, _ := merge(row, true, pod, "ns/a", row.Name, addrs("192.0.2.1"), t0.Add(30*time.Second+refreshSlack/2), []string{"r"}, 10); next != nil {
		t.Errorf("a small push wrote %+v", next)
	}
	// Pushed out further: written, no address added.
	next, added, _ := merge(row, true, pod, "ns/a", row.Name, addrs("192.0.2.1"), t0.Add(time.Minute), []string{"r"}, 10)
	if next == nil || added || !next.IPs[0].Expires.Equal(t0.Add(time.Minute)) {
		t.Errorf("push: %+v added=%v", next, added)
	}
	// A new address: added, sorted.
	next, added, _ = merge(row, true, pod, "ns/a", row.Name, addrs("192.0.2.0"), t0.Add(time.Minute), []string{"r"}, 10)
	if next == nil || !added || len(next.IPs) != 2 || next.IPs[0].IP != netip.MustParseAddr("192.0.2.0") {
		t.Errorf("new address: %+v added=%v", next, added)
	}
	// Past the cap, those that expire first go.
	next, _, dropped := merge(row, true, pod, "ns/a", row.Name, addrs("192.0.2.7", "192.0.2.8"), t0.Add(time.Hour), []string{"r"}, 2)
	if next == nil || dropped != 1 || len(next.IPs) != 2 || next.IPs[0].IP != netip.MustParseAddr("192.0.2.7") {
		t.Errorf("cap: %+v dropped=%d", next, dropped)
	}
}

func TestMatchName(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"api.example.com", "API.example.com.", true},
		{"api.example.com", "x.api.example.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "aexample.com", false},
		{"*.example.com", "a.example.com.evil.org", false},
		{"*.example.com", `a\.example.com`, false},
		{"*.example.com", `a\046b.example.com`, false},
	} {
		if got := endpoints.MatchName(tc.pattern, tc.name); got != tc.want {
			t.Errorf("MatchName(%q, %q) = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
}
