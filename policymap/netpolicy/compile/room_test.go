package compile

import (
	"net/netip"
	"slices"
	"testing"
)

func TestPlanRoom(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	set := func(pods ...netip.Addr) map[netip.Addr]bool {
		m := map[netip.Addr]bool{}
		for _, p := range pods {
			m[p] = true
		}
		return m
	}
	for _, tc := range []struct {
		name           string
		short          map[netip.Addr]uint32
		waiting, tried map[netip.Addr]bool
		alone          bool
		park, unpark   []netip.Addr
		passed         netip.Addr
	}{
		{name: "nothing short, nothing waits"},
		{name: "nothing short: the waiting go", waiting: set(b, c), unpark: []netip.Addr{b, c}},
		{name: "two short: the oldest version stays", short: map[netip.Addr]uint32{a: 9, b: 4, c: 7}, park: []netip.Addr{c, a}},
		{name: "the oldest passed over once: the next", short: map[netip.Addr]uint32{a: 9, b: 4, c: 7}, tried: set(b), park: []netip.Addr{b, a}},
		{name: "all passed over: the oldest again", short: map[netip.Addr]uint32{a: 9, b: 4}, tried: set(a, b), park: []netip.Addr{a}},
		{name: "one short, not for long", short: map[netip.Addr]uint32{a: 9}, waiting: set(b)},
		{name: "one short too long, never fits: passed over", short: map[netip.Addr]uint32{a: 9}, waiting: set(c, b), alone: true, passed: a, unpark: []netip.Addr{b, c}},
		{name: "one short too long, never fits, nothing waits", short: map[netip.Addr]uint32{a: 9}, alone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			park, unpark, passed := planRoom(tc.short, tc.waiting, tc.tried, tc.alone)
			if !slices.Equal(park, tc.park) || !slices.Equal(unpark, tc.unpark) || passed != tc.passed {
				t.Errorf("planRoom = park %v, unpark %v, passed %v; want %v, %v, %v",
					park, unpark, passed, tc.park, tc.unpark, tc.passed)
			}
		})
	}
}
