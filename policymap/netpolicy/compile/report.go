package compile

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
)

// What the deriver (derive.go) reports: its health.

// noteBad records the pod's entries that cannot be encoded.
func (d *deriver[T, K]) noteBad(pod netip.Addr, desired []*MapEntry[K]) {
	var bad []*MapEntry[K]
	for _, e := range desired {
		if e.EncodeError() != "" {
			bad = append(bad, e)
		}
	}
	if len(bad) == 0 {
		delete(d.bad, pod)
		return
	}
	d.bad[pod] = bad
}

// report sets health: Degraded, naming a few, while entries cannot be
// encoded (they deny: fail closed), OK otherwise; it names the objects
// compiling in the background.
func (d *deriver[T, K]) report(health cell.Health, ok string) {
	var bad []*MapEntry[K]
	for _, es := range d.bad {
		bad = append(bad, es...)
	}
	if n := len(bad); n > 0 {
		slices.SortFunc(bad, func(a, b *MapEntry[K]) int {
			return cmp.Compare(string(rowID[K](a.Map(), a.Pod, a.Peer(), a.Version)), string(rowID[K](b.Map(), b.Pod, b.Peer(), b.Version)))
		})
		var msgs []string
		for _, e := range bad[:min(n, 3)] {
			msgs = append(msgs, fmt.Sprintf("%s %s %s: %s", e.Map(), e.Pod, e.Peer(), e.EncodeError()))
		}
		health.Degraded(fmt.Sprintf("%d policy map entries cannot be encoded and deny (fail closed)", n),
			errors.New(strings.Join(msgs, "; ")))
		return
	}
	if c := d.compilingText(); c != "" {
		ok += "; " + c
	}
	health.OK(ok)
}

// compilingText names the objects compiling in the background.
func (d *deriver[T, K]) compilingText() string {
	var k K
	var out []string
	for _, bc := range d.compiling {
		out = append(out, fmt.Sprintf("compiling %s (%d rules and excepts) for %d pod IPs", bc.sel.names(), k.weight(bc.sel), len(bc.waiting)))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

func sortedAddrs(set map[netip.Addr]struct{}) []netip.Addr {
	out := make([]netip.Addr, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
