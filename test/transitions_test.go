package test

// A pod's policy changes in one step, as traffic: every key of a new
// version is in the kernel before the pod switches to it (one update of
// enimasq_policy_versions), and a version that cannot be written whole
// never comes into force. Each test counts, at the peer, the packets of
// new flows that the policy denies in every version it goes through:
// none may pass, whatever the agent is writing meanwhile.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The peer's addresses of the transition tests: trDenied is inside both
// 10.0.1.0/24 and 10.0.1.0/25 (every version denies it), trPeer2 is in
// 10.0.2.0/24, trPeer3 in 10.0.3.0/24 (every version allows it).
const (
	trDenied = "10.0.1.5"
	trPeer2  = "10.0.2.5"
	trPeer3  = "10.0.3.5"
	trPort   = 9999
	// trControlPort is the port of trPeer3 the floods' controls go to.
	trControlPort = 9998
)

// TestPrivilegedPolicyTransitionFullMap (issue item 1): the egress map
// holds 10 keys; pod A's PolicyEndpoint takes 4 of them, pod B's version
// "allow 10.0.0.0/8 except 10.0.1.0/24" 4 more. B's object changes to a
// version of 6 keys (a second except, another rule), which cannot be
// written while A's keys are there: B keeps its old version whole (10.0.1.x
// denied, 10.0.2.x and 10.0.3.x allowed), and health names B's pod, its
// object and ENOSPC. A's object removed, B's new version comes into force
// by itself (10.0.2.x denied now) and health recovers. All along, B floods
// new flows to 10.0.1.5, which every version denies: none may pass.
func TestPrivilegedPolicyTransitionFullMap(t *testing.T) {
	n := newTransitionNode(t)
	const devA, devB = "enimtr1a", "enimtr1b"
	n.addPod("a", devA, podA)
	n.addPod("b", devB, podB)
	peA := policyEndpoint("a", podA, []string{"Egress"}, nil,
		[]peRule{{cidr: "192.168.0.0/16", ports: []string{"TCP 443"}}, {cidr: "172.16.0.0/12", ports: []string{"TCP 443"}}})
	v1 := policyEndpoint("b", podB, []string{"Egress"}, nil, []peRule{{cidr: "10.0.0.0/8", except: []string{"10.0.1.0/24"}}})
	// The new except and a rule inside it: nested keys, so a new version
	// (an except added alone is an edit in place of 1 key, which fits:
	// compile's TestPrivilegedPolicyEditFitsWhereAVersionWouldNot).
	v2 := policyEndpoint("b", podB, []string{"Egress"}, nil, []peRule{
		{cidr: "10.0.0.0/8", except: []string{"10.0.1.0/24", "10.0.2.0/24"}},
		{cidr: "10.0.2.0/25", ports: []string{"TCP 443"}},
	})
	// 10 keys: A's 4 and B's 4 leave 2, too few for B's new version of 6
	// (the old one stays until the new one is in); without A, 4+6 fit.
	// (With 8, B's two versions, 4 and at least 5 keys, never fit at once:
	// the new one could never come into force.)
	n.start(map[string]string{"a": peA, "b": v1}, 2,
		"--policy-map-max-entries=10", "--bpf-map-retry-min=10ms", "--bpf-map-retry-max=100ms")
	old := n.waitNewVersion("B's first version in force", podB, networkPolicyTier, 0)
	t.Logf("B's version %d in force; the keys:\n%s", old, n.agent.MustDbg("bpf", "policy", "list"))
	n.expectFlows("B's version "+strconv.Itoa(int(old)), "b", 20, []string{trPeer3, trPeer2}, []string{trDenied})

	rcvbuf0 := n.rcvbufErrors()
	passed0, control0 := n.counters[trDenied].n.Load(), n.controls.n.Load()
	flood := n.floodNewFlows("b", devB, podB, trDenied, trPeer3, 100, 20)

	n.write("b", v2)
	var failing podVersionsRow
	n.agent.WaitFor("B's new version refused (ENOSPC), the old one in force", func() bool {
		var ok bool
		failing, ok = n.versions(podB)
		np := failing.NetworkPolicy
		return ok && np.Active == old && np.Want > old && strings.Contains(np.Failed, "no space left on device")
	})
	var health string
	n.agent.WaitFor("health Degraded naming B's pod, its object and ENOSPC", func() bool {
		_, body, err := n.agent.Get("/healthz")
		health = string(body)
		return err == nil && strings.Contains(health, "Degraded") &&
			strings.Contains(health, fmt.Sprintf("pod %s (e2e/b): NetworkPolicy version %d not written, the pod keeps version %d", podB, failing.NetworkPolicy.Want, old)) &&
			strings.Contains(health, "no space left on device")
	})
	if i := strings.Index(health, "pod "+podB+" (e2e/b)"); i >= 0 {
		health = health[i:]
		health = health[:strings.IndexAny(health, "\"\n")]
	}
	t.Logf("B's new version %d refused; health: %s\n%s\n%s", failing.NetworkPolicy.Want, health,
		n.agent.MustDbg("shell", "--", "db/show", "policy-versions"), n.agent.MustDbg("bpf", "policy", "list"))
	// The old version whole: 10.0.2.x still allowed (not the new version's
	// except, nor a mix), 10.0.1.x still denied.
	n.expectFlows("B's new version refused", "b", 20, []string{trPeer3, trPeer2}, []string{trDenied})
	// A while of retries (every 100 ms at most) under the flood: the new
	// version stays refused, the old one in force.
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		if row, _ := n.versions(podB); row.NetworkPolicy.Active != old || row.NetworkPolicy.Want != failing.NetworkPolicy.Want {
			t.Errorf("B's versions changed while the new one cannot be written: %+v", row.NetworkPolicy)
		}
	}

	// Room: A's object goes, B's new version comes into force by itself.
	if err := os.Remove(filepath.Join(n.dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	now := n.waitNewVersion("B's new version in force once A's keys are gone", podB, networkPolicyTier, old)
	t.Logf("B's version %d in force %s after A's object was removed", now, time.Since(start).Round(time.Millisecond))
	n.agent.WaitHealthy()
	n.expectFlows("B's new version in force", "b", 20, []string{trPeer3}, []string{trDenied, trPeer2})

	sent, controls := flood.stop(t)
	deadline := time.Now().Add(3 * time.Second)
	for n.controls.n.Load()-control0 < controls && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	passed, gotControls := n.counters[trDenied].n.Load()-passed0, n.controls.n.Load()-control0
	dropped := n.rcvbufErrors() - rcvbuf0
	t.Logf("flood of new flows B -> %s through the whole transition: %d frames sent, %d passed; controls to %s: %d sent, %d arrived; peer Udp RcvbufErrors +%d",
		trDenied, sent, passed, trPeer3, controls, gotControls, dropped)
	if passed != 0 || dropped != 0 {
		t.Errorf("%d of %d frames to %s (denied in every version) reached the peer (and %d dropped at its socket), want 0", passed, sent, trDenied, dropped)
	}
	if gotControls != controls || controls == 0 {
		t.Errorf("controls to %s: %d sent, %d arrived: the flood's path is broken", trPeer3, controls, gotControls)
	}
}

// swapFlood floods new flows from pod B to trDenied (frames through
// AF_PACKET, as fast as they go, every 1000th to trPeer3 instead as a
// control), writes the file rewrites times alternating between the two
// contents, waiting each time until the tier's new version is in force,
// and checks that no frame to trDenied reached the peer.
func (n *transitionNode) swapFlood(device, file string, contents [2]string, tier func(podVersionsRow) tierVersions, rewrites int) {
	t := n.t
	t.Helper()
	version := n.waitNewVersion("B's first version in force", podB, tier, 0)
	n.expectFlows("before the swaps", "b", 20, []string{trPeer3}, []string{trDenied})

	passed0, control0 := n.counters[trDenied].n.Load(), n.controls.n.Load()
	rx0, rcvbuf0 := n.rxPackets(device), n.rcvbufErrors()
	flood := n.floodNewFlows("b", device, podB, trDenied, trPeer3, 1000, 0)
	start := time.Now()
	var slowest time.Duration
	for i := range rewrites {
		began := time.Now()
		n.write(file, contents[(i+1)%2])
		version = n.waitNewVersion(fmt.Sprintf("rewrite %d in force", i+1), podB, tier, version)
		slowest = max(slowest, time.Since(began))
	}
	took := time.Since(start)
	sent, controls := flood.stop(t)
	deadline := time.Now().Add(3 * time.Second)
	for n.controls.n.Load()-control0 < controls && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	passed, gotControls := n.counters[trDenied].n.Load()-passed0, n.controls.n.Load()-control0
	judged, dropped := n.rxPackets(device)-rx0, n.rcvbufErrors()-rcvbuf0
	t.Logf("%d rewrites in %s (slowest %s, last version %d); flood B -> %s: %d frames sent, %d passed; controls to %s: %d sent, %d arrived; %d frames reached B's device; peer Udp RcvbufErrors +%d",
		rewrites, took.Round(time.Millisecond), slowest.Round(time.Millisecond), version, trDenied, sent, passed, trPeer3, controls, gotControls, judged, dropped)
	if passed != 0 || dropped != 0 {
		t.Errorf("%d of %d frames of new flows to %s (denied by every version) reached the peer (and %d dropped at its socket), want 0", passed, sent, trDenied, dropped)
	}
	if gotControls != controls || controls == 0 {
		t.Errorf("controls to %s: %d sent, %d arrived: the flood's path is broken", trPeer3, controls, gotControls)
	}
	n.expectFlows("after the swaps", "b", 20, []string{trPeer3}, []string{trDenied})
}

// TestPrivilegedPolicyTransitionKeySwapFlood (issue item 2): pod B allows
// 10.0.0.0/8 except 10.0.1.0/24; its file is rewritten 30 times, the
// except swapped between 10.0.1.0/24 and 10.0.1.0/25 (each time a key
// goes and another comes), while B floods new flows to 10.0.1.5, inside
// both excepts. None may reach the peer.
func TestPrivilegedPolicyTransitionKeySwapFlood(t *testing.T) {
	n := newTransitionNode(t)
	const dev = "enimtr2b"
	n.addPod("b", dev, podB)
	v24 := policyEndpoint("b", podB, []string{"Egress"}, nil, []peRule{{cidr: "10.0.0.0/8", except: []string{"10.0.1.0/24"}}})
	v25 := policyEndpoint("b", podB, []string{"Egress"}, nil, []peRule{{cidr: "10.0.0.0/8", except: []string{"10.0.1.0/25"}}})
	n.start(map[string]string{"b": v24}, 1)
	n.swapFlood(dev, "b", [2]string{v24, v25}, networkPolicyTier, 30)
}

// TestPrivilegedPolicyTransitionAdminKeySwapFlood: the Admin variant. Pod
// B is under an Admin Accept of 10.0.0.0/8 (priority 20) and an Admin Deny
// of 10.0.1.0/24 (priority 10, so it wins); the Deny's ClusterPolicyEndpoint
// is rewritten 30 times, its cidr swapped between 10.0.1.0/24 and
// 10.0.1.0/25, while B floods new flows to 10.0.1.5. None may reach the
// peer.
func TestPrivilegedPolicyTransitionAdminKeySwapFlood(t *testing.T) {
	n := newTransitionNode(t)
	const dev = "enimtr3b"
	n.addPod("b", dev, podB)
	accept := clusterPolicyEndpoint("accept-10", "Admin", 20, []string{podB}, nil, []cpeRule{{cidr: "10.0.0.0/8", action: "Accept"}})
	deny := func(cidr string) string {
		return clusterPolicyEndpoint("deny-10-0-1", "Admin", 10, []string{podB}, nil, []cpeRule{{cidr: cidr, action: "Deny"}})
	}
	n.start(map[string]string{"accept-10": accept, "deny-10-0-1": deny("10.0.1.0/24")}, 1)
	n.swapFlood(dev, "deny-10-0-1", [2]string{deny("10.0.1.0/24"), deny("10.0.1.0/25")}, clusterTier, 30)
}

// TestPrivilegedPolicyTransitionEditFlood: edits in place under a flood.
// Pod B allows 10.0.0.0/8 except 10.0.1.0/24, and one peer inside that
// except, which its file swaps 30 times between 10.0.1.6 and 10.0.1.7 (a
// peer pod replaced, as the AWS controller writes it: one key out, one in,
// an edit of the version in force, compile/edit.go), while B floods new
// flows to 10.0.1.5, denied by the except throughout. None may reach the
// peer, and the version never changes.
func TestPrivilegedPolicyTransitionEditFlood(t *testing.T) {
	n := newTransitionNode(t)
	const dev = "enimtr4b"
	n.addPod("b", dev, podB)
	with := func(peer string) string {
		return policyEndpoint("b", podB, []string{"Egress"}, nil, []peRule{{cidr: "10.0.0.0/8", except: []string{"10.0.1.0/24"}}, {cidr: peer}})
	}
	peers := [2]string{"10.0.1.6/32", "10.0.1.7/32"}
	n.start(map[string]string{"b": with(peers[0])}, 1)
	version := n.waitNewVersion("B's first version in force", podB, networkPolicyTier, 0)
	n.expectFlows("before the edits", "b", 20, []string{trPeer3}, []string{trDenied})

	passed0, control0 := n.counters[trDenied].n.Load(), n.controls.n.Load()
	rcvbuf0 := n.rcvbufErrors()
	flood := n.floodNewFlows("b", dev, podB, trDenied, trPeer3, 1000, 0)
	start := time.Now()
	for i := range 30 {
		came, gone := peers[(i+1)%2], peers[i%2]
		n.write("b", with(came))
		n.agent.WaitFor(fmt.Sprintf("edit %d in the kernel", i+1), func() bool {
			keys := n.agent.MustDbg("bpf", "policy", "list")
			row, ok := n.versions(podB)
			return ok && row.settled(networkPolicyTier) && strings.Contains(keys, " "+came+" ") && !strings.Contains(keys, " "+gone+" ")
		})
		if row, _ := n.versions(podB); row.NetworkPolicy.Active != version {
			t.Fatalf("edit %d: B at version %d, want %d (edited in place)", i+1, row.NetworkPolicy.Active, version)
		}
	}
	took := time.Since(start)
	sent, controls := flood.stop(t)
	deadline := time.Now().Add(3 * time.Second)
	for n.controls.n.Load()-control0 < controls && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	passed, gotControls, dropped := n.counters[trDenied].n.Load()-passed0, n.controls.n.Load()-control0, n.rcvbufErrors()-rcvbuf0
	t.Logf("30 edits in %s; flood B -> %s: %d frames sent, %d passed; controls to %s: %d sent, %d arrived",
		took.Round(time.Millisecond), trDenied, sent, passed, trPeer3, controls, gotControls)
	if passed != 0 || dropped != 0 {
		t.Errorf("%d of %d frames of new flows to %s (denied by every state) reached the peer (and %d dropped at its socket), want 0", passed, sent, trDenied, dropped)
	}
	if gotControls != controls || controls == 0 {
		t.Errorf("controls to %s: %d sent, %d arrived: the flood's path is broken", trPeer3, controls, gotControls)
	}
	n.expectFlows("after the edits", "b", 20, []string{trPeer3}, []string{trDenied})
}
