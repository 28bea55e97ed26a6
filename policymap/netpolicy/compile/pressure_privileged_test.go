package compile

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// pressurePolicy is the policy of 8 pods (10.200.0.2-9), each with
// egress to its own 10.i.0.0/16 but four /24 excepts, and TCP 443 to its
// own 192.168.i.0/24. Step 1 gives every pod a new version: the /16 gets
// a port (its value changes) and a fifth except under it (nested keys,
// no edit in place). Step 2 revokes the 192.168.i.0/24 rule. extra are
// more excepts under the /16 of pod 0 from step 1 on.
func pressurePolicy(t *testing.T, step, extra int) []*endpoints.PolicyEndpoint {
	var pes []string
	for i := range 8 {
		var egress strings.Builder
		excepts := []string{}
		for j := range 4 {
			excepts = append(excepts, fmt.Sprintf("10.%d.%d.0/24", i, j))
		}
		ports := ""
		if step >= 1 {
			excepts = append(excepts, fmt.Sprintf("10.%d.9.0/24", i))
			ports = ", ports: [{port: 80}]"
			if i == 0 {
				for j := range extra {
					excepts = append(excepts, fmt.Sprintf("10.%d.%d.%d/32", i, 100+j/250, j%250))
				}
			}
		}
		fmt.Fprintf(&egress, "  - {cidr: 10.%d.0.0/16, except: [%s]%s}\n", i, strings.Join(excepts, ", "), ports)
		if step < 2 {
			fmt.Fprintf(&egress, "  - {cidr: 192.168.%d.0/24, ports: [{port: 443}]}\n", i)
		}
		pes = append(pes, pe(fmt.Sprint("p", i), fmt.Sprintf("  podIsolation: [Egress]\n"+
			"  podSelectorEndpoints: [{hostIP: 10.0.1.1, podIP: 10.200.0.%d}]\n  egress:\n%s", i+2, egress.String())))
	}
	return mustParse(t, pes...)
}

func pressurePods(pes []*endpoints.PolicyEndpoint) []*PolicyMapEntry {
	var out []*PolicyMapEntry
	for i := range pes {
		out = append(out, CompilePod(netip.AddrFrom4([4]byte{10, 200, 0, byte(i + 2)}), pes[i:i+1])...)
	}
	return out
}

// TestPrivilegedPolicyConvergesUnderPressure: with the maps 0.7 and 0.8
// full, a change that gives every pod a new version (which cannot all be
// written beside the versions in force at once) and a revocation right
// after it both apply: every pod ends at its final policy (room.go).
// Before, every pod's new version got part of its keys in, none was whole,
// and the pods kept their first policy, the revoked rule included.
func TestPrivilegedPolicyConvergesUnderPressure(t *testing.T) {
	perPod := 0
	for _, e := range pressurePods(pressurePolicy(t, 0, 0)[:1]) {
		if strings.Contains(e.Map(), "egress") {
			perPod++
		}
	}
	for _, pressure := range []int{70, 80} {
		t.Run(fmt.Sprint("pressure 0.", pressure), func(t *testing.T) {
			maxEntries := uint32(8 * perPod * 100 / pressure)
			h := startPolicyHarness(t, harnessOptions{maxEntries: maxEntries})
			h.setEndpoints(pressurePolicy(t, 0, 0))
			h.waitConverged(pressurePods(pressurePolicy(t, 0, 0)))
			h.setEndpoints(pressurePolicy(t, 1, 0))
			h.setEndpoints(pressurePolicy(t, 2, 0))
			h.waitConverged(pressurePods(pressurePolicy(t, 2, 0)))
		})
	}
}

// TestPrivilegedPolicyRoomNotHeldByOneThatNeverFits: pod 0's new version
// cannot fit even alone (60 more excepts, in maps with room for a few);
// it does not hold the others: after its turn (roomTurn) they are written
// and come into force, and pod 0 keeps its version in force, named in its
// versions row as not written for want of room.
func TestPrivilegedPolicyRoomNotHeldByOneThatNeverFits(t *testing.T) {
	perPod := 0
	for _, e := range pressurePods(pressurePolicy(t, 0, 0)[:1]) {
		if strings.Contains(e.Map(), "egress") {
			perPod++
		}
	}
	h := startPolicyHarness(t, harnessOptions{maxEntries: uint32(8*perPod + 16)})
	h.setEndpoints(pressurePolicy(t, 0, 0))
	h.waitConverged(pressurePods(pressurePolicy(t, 0, 0)))
	pod0 := netip.MustParseAddr("10.200.0.2")
	v0 := h.versionOf(pod0)
	before := map[netip.Addr]uint32{}
	for v := range h.versionsTable.All(h.db.ReadTxn()) {
		before[v.Pod] = v.Tiers[policybpf.TierNetworkPolicy].Active
	}
	h.setEndpoints(pressurePolicy(t, 2, 60))
	// Every other pod at its final policy, in force and whole (the switch
	// brings only whole versions into force): its rows at its version in
	// force are the final policy's, Done.
	final := map[netip.Addr]map[string]bool{}
	for _, e := range pressurePods(pressurePolicy(t, 2, 60)) {
		if final[e.Pod] == nil {
			final[e.Pod] = map[string]bool{}
		}
		final[e.Pod][entryID(e)] = true
	}
	celltest.Await(t, 30*time.Second, func() (bool, <-chan struct{}, string) {
		txn := h.db.ReadTxn()
		iter, watch := h.entries.AllWatch(txn)
		rows := map[netip.Addr]map[string]bool{}
		for e := range iter {
			row, _, _ := h.versionsTable.Get(txn, PodVersionsIndex.Query(e.Pod))
			if row != nil && e.Version == row.Tiers[policybpf.TierNetworkPolicy].Active && e.Status.Kind == reconciler.StatusKindDone {
				if rows[e.Pod] == nil {
					rows[e.Pod] = map[string]bool{}
				}
				rows[e.Pod][entryID(e)] = true
			}
		}
		for pod, want := range final {
			if pod != pod0 && !maps.Equal(rows[pod], want) {
				return false, watch, fmt.Sprintf("pod %s: in force %d entries, want the final %d", pod, len(rows[pod]), len(want))
			}
		}
		return true, watch, ""
	})
	if got := h.versionOf(pod0); got != v0 {
		t.Errorf("pod 0 at version %d, want %d (its new version never fits)", got, v0)
	}
	h.waitVersionFailing(pod0)
	row, _, _ := h.versionsTable.Get(h.db.ReadTxn(), PodVersionsIndex.Query(pod0))
	if tv := row.Tiers[policybpf.TierNetworkPolicy]; !isNoRoom(tv.Failed) {
		t.Errorf("pod 0's versions row does not say its new version did not fit: %+v", tv)
	}
}

// TestPrivilegedPolicyRestartUnderPressureKeepsVersionsInForce: an agent
// restarts with maps 0.8 full and a change that gives every pod a new
// version (they do not all fit: some are taken back, room.go). A pod taken
// back stays at the version the earlier run left in force, which this run
// has not taken over: its keys are kept by the prune (versions.go keep)
// while it is in force. Watched from the kernel the whole time: no pod's
// version in force ever lacks its root key.
func TestPrivilegedPolicyRestartUnderPressureKeepsVersionsInForce(t *testing.T) {
	perPod := 0
	for _, e := range pressurePods(pressurePolicy(t, 0, 0)[:1]) {
		if strings.Contains(e.Map(), "egress") {
			perPod++
		}
	}
	maxEntries := uint32(8 * perPod * 100 / 80)
	o := harnessOptions{maxEntries: maxEntries}
	first := startPolicyHarness(t, o)
	first.setEndpoints(pressurePolicy(t, 0, 0))
	first.waitConverged(pressurePods(pressurePolicy(t, 0, 0)))
	first.stop()

	o.node = first.node
	h := startPolicyHarness(t, o)
	var mu sync.Mutex
	var bad []string
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			vm := h.versions.versionsMap()
			maps := h.ops.Opened()
			em := maps[policybpf.PolicyEgressV4MapName]
			if vm == nil || em == nil {
				time.Sleep(time.Millisecond)
				continue
			}
			keys, err := bpf.Keys(em)
			if err != nil {
				continue
			}
			roots := map[netip.Addr]map[uint32]bool{}
			for _, k := range keys {
				pod, v, peer, err := bpf.UnmarshalPolicyKeyVersion(bpf.IPv4, k)
				if err != nil || peer.Bits() != 0 {
					continue
				}
				if roots[pod] == nil {
					roots[pod] = map[uint32]bool{}
				}
				roots[pod][v] = true
			}
			for i := range 8 {
				pod := netip.AddrFrom4([4]byte{10, 200, 0, byte(i + 2)})
				vs, ok := h.versions.lookup(vm, pod)
				if !ok || vs[0] == 0 || vs[0] == policybpf.PolicyVersionClosed {
					continue
				}
				// re-read after the lookup: the root may have been written since
				if !roots[pod][vs[0]] {
					k2, _ := bpf.Keys(em)
					found := false
					for _, k := range k2 {
						p, v, peer, err := bpf.UnmarshalPolicyKeyVersion(bpf.IPv4, k)
						if err == nil && p == pod && v == vs[0] && peer.Bits() == 0 {
							found = true
						}
					}
					vs2, _ := h.versions.lookup(vm, pod)
					if !found && vs2 == vs {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("%s v%d", pod, vs[0]))
						mu.Unlock()
					}
				}
			}
			time.Sleep(500 * time.Microsecond)
		}
	}()
	h.setEndpoints(pressurePolicy(t, 1, 0))
	h.waitConverged(pressurePods(pressurePolicy(t, 1, 0)))
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		n := min(len(bad), 10)
		t.Errorf("%d observations of a version in force with no root key in its egress map, e.g. %v", len(bad), bad[:n])
	}
}
