package dnsproxy

import (
	"net/netip"
	"testing"
)

// Each pod holds at most its share of a bound; what one pod holds does not
// take from another's share.
func TestPerPod(t *testing.T) {
	c := newPerPod(8) // 2 each
	a, b := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	for range 2 {
		if !c.take(a) {
			t.Fatal("a pod's share refused")
		}
	}
	if c.take(a) {
		t.Error("a pod took past its share")
	}
	if !c.take(b) {
		t.Error("another pod refused while the first holds its share")
	}
	c.put(a)
	if !c.take(a) {
		t.Error("a slot put back is not taken again")
	}
	c.put(a)
	c.put(a)
	c.put(b)
	if len(c.held) != 0 {
		t.Errorf("pods left holding nothing stay counted: %v", c.held)
	}
	if newPerPod(1).max != 1 {
		t.Error("a bound below the share gives a pod nothing")
	}
}
