package ciliumnode

import (
	"net/netip"
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/filesource"
)

// What leaves the CiliumNode is held for the grace period and then goes,
// and nothing is left waiting once it has: no hold keeps asking for a read.
func TestLossHoldEnds(t *testing.T) {
	now := time.Unix(0, 0)
	h := newLossHold(10 * time.Second)
	h.now = func() time.Time { return now }
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	eni := func(id string, pool ...netip.Addr) *ENI { return &ENI{ID: id, Number: len(id), Pool: pool} }
	apply := func(rows ...*ENI) []*ENI { return h.apply(&filesource.Input[*ENI]{Rows: rows}).Rows }

	apply(eni("eni-1", ip("10.0.0.1"), ip("10.0.0.2")), eni("eni-22", ip("10.0.1.1"), ip("10.0.1.2")))
	// eni-22 loses an IP, then goes; eni-1 loses one: all held.
	apply(eni("eni-1", ip("10.0.0.1"), ip("10.0.0.2")), eni("eni-22", ip("10.0.1.1")))
	got := apply(eni("eni-1", ip("10.0.0.1")))
	if len(got) != 2 || len(got[0].Pool) != 2 || len(got[1].Pool) != 2 || h.next() != 10*time.Second {
		t.Fatalf("held: %+v, next %s", got, h.next())
	}
	now = now.Add(11 * time.Second)
	got = apply(eni("eni-1", ip("10.0.0.1")))
	if len(got) != 1 || len(got[0].Pool) != 1 {
		t.Errorf("after the grace: %+v, want eni-1 with its one IP", got)
	}
	if d := h.next(); d != 0 {
		t.Errorf("after the grace a hold still asks for a read in %s", d)
	}
}
