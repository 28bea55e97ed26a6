package prefixorder

import (
	"net/netip"
	"slices"
	"testing"
)

func TestCompare(t *testing.T) {
	in := []string{"fe80::/10", "10.0.0.0/16", "192.168.0.0/16", "10.0.0.0/8", "10.0.0.0/24", "9.0.0.0/8", "::/0"}
	want := []string{"9.0.0.0/8", "10.0.0.0/8", "10.0.0.0/16", "10.0.0.0/24", "192.168.0.0/16", "::/0", "fe80::/10"}
	var ps []netip.Prefix
	for _, s := range in {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	slices.SortFunc(ps, Compare)
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	if !slices.Equal(got, want) {
		t.Errorf("sorted %v, want %v", got, want)
	}
}
