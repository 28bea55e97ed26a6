package compile

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// countOps interposes a counter on every map of the harness and returns
// the sum of their element operations.
func (h *policyHarness) countOps() func() int64 {
	var counters []*countingMap
	for name, m := range h.kernelMaps() {
		c := &countingMap{Map: m}
		counters = append(counters, c)
		h.ops.Interpose(name, c)
	}
	return func() int64 {
		var n int64
		for _, c := range counters {
			n += c.ops.Load()
		}
		return n
	}
}

// waitVersionFailing waits until a pod's new NetworkPolicy version cannot
// be written (Failed), the one in force another.
func (h *policyHarness) waitVersionFailing(pod netip.Addr) {
	h.tb.Helper()
	celltest.Await(h.tb, 30*time.Second, func() (bool, <-chan struct{}, string) {
		row, _, watch, ok := h.versionsTable.GetWatch(h.db.ReadTxn(), PodVersionsIndex.Query(pod))
		if !ok {
			return false, watch, "no versions row"
		}
		tv := row.Tiers[policybpf.TierNetworkPolicy]
		return tv.Failed != "" && tv.Want != tv.Active, watch, strings.Join(row.TableRow(), " ")
	})
}

// versionOf is a pod's NetworkPolicy version in force.
func (h *policyHarness) versionOf(pod netip.Addr) uint32 {
	row, _, ok := h.versionsTable.Get(h.db.ReadTxn(), PodVersionsIndex.Query(pod))
	if !ok {
		return 0
	}
	return row.Tiers[policybpf.TierNetworkPolicy].Active
}

// TestPrivilegedPolicyRestartAdopts: an agent that restarts with the same
// objects takes over what the kernel holds (adopt.go): no map operation,
// every pod at the version the earlier run left. With one peer replaced in
// an object while it was down, it writes that change alone, in place (one
// key in, one out); with an except moved under a cidr (nested keys), that
// pod gets a new version.
func TestPrivilegedPolicyRestartAdopts(t *testing.T) {
	spec := func(pod, egress string) string {
		return "  podIsolation: [Egress, Ingress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: " + pod + "}]\n" +
			"  ingress:\n  - cidr: 10.3.0.0/16\n  egress:\n" + egress
	}
	objects := func(peer, except string) []*endpoints.PolicyEndpoint {
		return mustParse(t,
			pe("a", spec("10.0.0.5", "  - {cidr: "+peer+", ports: [{port: 80}]}\n  - {cidr: 10.1.0.9/32, ports: [{port: 80}]}\n")),
			pe("b", spec("10.0.0.6", "  - {cidr: 10.2.0.0/16, except: ["+except+"]}\n")))
	}
	a, b := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6")
	compiled := func(pes []*endpoints.PolicyEndpoint) []*PolicyMapEntry {
		return append(CompilePod(a, pes[:1]), CompilePod(b, pes[1:])...)
	}
	args := []string{"--bpf-map-refresh-interval=1h"}
	first := startPolicyHarness(t, harnessOptions{args: args})
	before := objects("10.1.0.7/32", "10.2.3.0/24")
	first.setEndpoints(before)
	first.waitConverged(compiled(before))
	va, vb := first.versionOf(a), first.versionOf(b)
	first.stop()

	// The same objects: nothing written.
	h := startPolicyHarness(t, harnessOptions{node: first.node, args: args})
	ops := h.countOps()
	h.setEndpoints(before)
	h.waitConverged(compiled(before))
	if n := ops(); n != 0 {
		t.Errorf("a restart with the same objects made %d map operations, want 0", n)
	}
	if h.versionOf(a) != va || h.versionOf(b) != vb {
		t.Errorf("versions %d, %d after the restart, want the earlier run's %d, %d", h.versionOf(a), h.versionOf(b), va, vb)
	}
	h.stop()

	// A peer replaced in a's object: that key out, the new one in, in
	// place; b's except moved from /24 to /25: a new version for b.
	h = startPolicyHarness(t, harnessOptions{node: first.node, args: args})
	ops = h.countOps()
	after := objects("10.1.0.8/32", "10.2.3.0/25")
	h.setEndpoints(after)
	h.waitConverged(compiled(after))
	if h.versionOf(a) != va {
		t.Errorf("pod a at version %d after a peer was replaced, want %d (edited in place)", h.versionOf(a), va)
	}
	if h.versionOf(b) == vb {
		t.Errorf("pod b kept version %d after its except moved (nested keys: a new version)", vb)
	}
	// a: the new peer's key written when the kernel's entries are taken
	// over, the old peer's deleted by the next compile (an edit); its
	// witness (edit.go) and the flow control's probe of a deletion
	// (throttle.go) may each write a key again.
	bEntries := int64(len(CompilePod(b, before[1:])) + len(CompilePod(b, after[1:])))
	if n := ops(); n < 2+bEntries || n > 4+bEntries {
		t.Errorf("%d map operations, want 2 (to 4) for a's peer and %d for b's new version and its old one's deletion", n, bEntries)
	}
}

// TestPrivilegedPolicyRevertCostsNothing: a pod's new version cannot be
// written (a key the kernel refuses); its object goes back to what is in
// force. The version on the way goes and nothing is written: the pod stays
// at its version, whose rows are as they were, and the only map
// operations are the deletions of the abandoned version's keys.
func TestPrivilegedPolicyRevertCostsNothing(t *testing.T) {
	spec := func(egress string) string {
		return "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  egress:\n" + egress
	}
	pod := netip.MustParseAddr("10.0.0.5")
	before := mustParse(t, pe("a", spec("  - {cidr: 10.2.0.7/32, ports: [{port: 80}]}\n")))
	// Nested keys: a new version, whose 10.2.0.0/24 key is refused.
	after := mustParse(t, pe("a", spec("  - {cidr: 10.2.0.0/24, except: [10.2.0.7/32], ports: [{port: 80}]}\n")))
	h := startPolicyHarness(t, harnessOptions{})
	h.setEndpoints(before)
	h.waitConverged(CompilePod(pod, before))
	v := h.versionOf(pod)

	failing := netip.MustParsePrefix("10.2.0.0/24")
	h.ops.Faults().SetFaultFunc(func(_ string, key []byte) error {
		if _, _, peer, err := bpf.UnmarshalPolicyKeyVersion(bpf.IPv4, key); err == nil && peer == failing {
			return errTest
		}
		return nil
	})
	h.setEndpoints(after)
	h.waitVersionFailing(pod)
	pending := 0
	for e := range h.entries.Prefix(h.db.ReadTxn(), PodEntries(pod)) {
		if e.Version != v {
			pending++
		}
	}

	ops := h.countOps()
	h.setEndpoints(before)
	h.waitConverged(CompilePod(pod, before))
	if got := h.versionOf(pod); got != v {
		t.Errorf("back to the policy in force: version %d, want %d", got, v)
	}
	if n := ops(); n > int64(pending) {
		t.Errorf("%d map operations to go back, want at most the %d deletions of the abandoned version", n, pending)
	}
	row, _, _ := h.versionsTable.Get(h.db.ReadTxn(), PodVersionsIndex.Query(pod))
	if tv := row.Tiers[policybpf.TierNetworkPolicy]; tv.Want != v || tv.Failed != "" {
		t.Errorf("versions row %s, want version %d alone, no failure", strings.Join(row.TableRow(), " "), v)
	}
}

// TestPrivilegedPolicyEditFitsWhereAVersionWouldNot: maps of 10 keys hold
// pod a's 4 and pod b's 4; b's object gains an except under its cidr and
// a rule beside it. A new version of b (6 keys beside its 4) would not
// fit; the change is an edit in place of 2 keys (edit.go), which does: it
// comes into force at b's version, the map full.
func TestPrivilegedPolicyEditFitsWhereAVersionWouldNot(t *testing.T) {
	a := pe("a", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.1.1, podIP: 10.0.0.2}]\n"+
		"  egress:\n  - {cidr: 192.168.0.0/16, ports: [{port: 443}]}\n  - {cidr: 172.16.0.0/12, ports: [{port: 443}]}\n")
	b := func(egress string) string {
		return pe("b", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.1.1, podIP: 10.0.0.3}]\n  egress:\n"+egress)
	}
	before := mustParse(t, a, b("  - {cidr: 10.0.0.0/8, except: [10.0.1.0/24]}\n"))
	after := mustParse(t, a, b("  - {cidr: 10.0.0.0/8, except: [10.0.1.0/24, 10.0.2.0/24]}\n  - {cidr: 192.0.2.0/24, ports: [{port: 443}]}\n"))
	podA, podB := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	compiled := func(pes []*endpoints.PolicyEndpoint) []*PolicyMapEntry {
		return append(CompilePod(podA, pes[:1]), CompilePod(podB, pes[1:])...)
	}
	if n := len(CompilePod(podB, after[1:])); n != 7 { // 6 egress, 1 ingress
		t.Fatalf("b's new policy has %d entries, want 7", n)
	}
	h := startPolicyHarness(t, harnessOptions{maxEntries: 10})
	h.setEndpoints(before)
	h.waitConverged(compiled(before))
	v := h.versionOf(podB)
	h.setEndpoints(after)
	h.waitConverged(compiled(after))
	if got := h.versionOf(podB); got != v {
		t.Errorf("b at version %d, want %d (edited in place)", got, v)
	}
}

// TestPrivilegedPolicyRestartFullMap: maps exactly full (pressure 1) hold
// two pods' policies; an agent that restarts with the same objects takes
// them over without a key of room (a new version of every pod would need
// twice the keys: it never came into force).
func TestPrivilegedPolicyRestartFullMap(t *testing.T) {
	pes := mustParse(t,
		pe("a", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.1.1, podIP: 10.0.0.2}]\n"+
			"  egress:\n  - {cidr: 192.168.0.0/16, ports: [{port: 443}]}\n  - {cidr: 172.16.0.0/12, ports: [{port: 443}]}\n"),
		pe("b", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.1.1, podIP: 10.0.0.3}]\n"+
			"  egress:\n  - {cidr: 10.0.0.0/8, except: [10.0.1.0/24]}\n"))
	podA, podB := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	want := append(CompilePod(podA, pes[:1]), CompilePod(podB, pes[1:])...)
	egress := 0
	for _, e := range want {
		if e.Map() == policybpf.PolicyEgressV4MapName {
			egress++
		}
	}
	o := harnessOptions{maxEntries: uint32(egress), args: []string{"--bpf-map-refresh-interval=1h"}}
	first := startPolicyHarness(t, o)
	first.setEndpoints(pes)
	first.waitConverged(want)
	va, vb := first.versionOf(podA), first.versionOf(podB)
	first.stop()

	o.node = first.node
	h := startPolicyHarness(t, o)
	ops := h.countOps()
	h.setEndpoints(pes)
	h.waitConverged(want)
	if h.versionOf(podA) != va || h.versionOf(podB) != vb {
		t.Errorf("versions %d, %d after the restart, want the earlier run's %d, %d", h.versionOf(podA), h.versionOf(podB), va, vb)
	}
	if n := ops(); n != 0 {
		t.Errorf("%d map operations at a restart with the same objects, want 0", n)
	}
}

// TestPrivilegedPolicyChunksGoWithTheirVersion: pods whose policies have
// more ports than a value holds churn through 24 changes, half of them new
// versions (an except added or removed under the cidr), half edits of the
// version in force (the ports moved), on chunk maps of 48 entries and no
// prune in sight: every change comes into force, and the chunk map holds
// exactly the chunks of the final entries. Before, a version's chunks
// stayed until the prune and the 4th or so change no longer fit.
func TestPrivilegedPolicyChunksGoWithTheirVersion(t *testing.T) {
	pods := []string{"10.0.0.2", "10.0.0.3", "10.0.0.4"}
	policy := func(step int) []*endpoints.PolicyEndpoint {
		var ports strings.Builder
		for i := range 200 { // 200 intervals: 32 inline, 3 chunks
			fmt.Fprintf(&ports, "{port: %d}, ", 1000+2*i+step)
		}
		var pes []string
		for i, pod := range pods {
			except := ""
			if step%4 >= 2 {
				except = ", except: [10.1.0.0/16]"
			}
			pes = append(pes, pe(fmt.Sprint("p", i), fmt.Sprintf("  podIsolation: [Egress]\n"+
				"  podSelectorEndpoints: [{hostIP: 10.0.1.1, podIP: %s}]\n"+
				"  egress:\n  - {cidr: 10.0.0.0/8%s, ports: [%s]}\n", pod, except, strings.TrimSuffix(ports.String(), ", "))))
		}
		return mustParse(t, pes...)
	}
	compiled := func(pes []*endpoints.PolicyEndpoint) []*PolicyMapEntry {
		var out []*PolicyMapEntry
		for i, pod := range pods {
			out = append(out, CompilePod(netip.MustParseAddr(pod), pes[i:i+1])...)
		}
		return out
	}
	h := startPolicyHarness(t, harnessOptions{maxEntries: 48, args: []string{"--bpf-map-refresh-interval=1h"}})
	var last []*endpoints.PolicyEndpoint
	for step := range 24 {
		last = policy(step)
		h.setEndpoints(last)
		h.waitConverged(compiled(last))
	}
	want := map[string]bool{}
	for _, e := range compiled(last) {
		for _, c := range e.Spill() {
			want[string(c.Key)] = true
		}
	}
	if len(want) == 0 {
		t.Fatal("the final policy has no chunks")
	}
	chunks := h.kernelMaps()[policybpf.PolicyChunksMapName]
	got := map[string]bool{}
	var k []byte
	for it := chunks.Iterate(); it.Next(&k, new([]byte)); {
		got[string(k)] = true
	}
	if len(got) != len(want) {
		t.Errorf("the chunk map holds %d chunks, the final entries %d", len(got), len(want))
	}
	for c := range want {
		if !got[c] {
			t.Errorf("chunk %x of the final entries is not in the kernel", c)
		}
	}
}
