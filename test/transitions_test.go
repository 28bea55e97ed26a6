package test

// A pod's policy changes in one step, as traffic: every key of a new
// version is in the kernel before the pod switches to it (one update of
// enimasq_policy_versions), and a version that cannot be written whole
// never comes into force. Each test counts, at the peer, the packets of
// new flows that the policy denies in every version it goes through:
// none may pass, whatever the agent is writing meanwhile.

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
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

// transitionNode is a policy node whose peer also answers on trDenied,
// trPeer2 and trPeer3 (the node routes 10.0.2.0/24 and 10.0.3.0/24 to
// it), with a counter of the UDP datagrams that reach trPort of each.
type transitionNode struct {
	*policyNode
	agent    *Agent
	dir      string
	counters map[string]*trCounter // peer address -> datagrams to trPort
	controls *trCounter            // datagrams to trPeer3:trControlPort
}

func newTransitionNode(t *testing.T) *transitionNode {
	t.Helper()
	n := &transitionNode{policyNode: newPolicyNode(t), counters: map[string]*trCounter{}}
	peer := n.peerNS()
	for _, ip := range []string{trDenied, trPeer2, trPeer3} {
		run(t, "ip", "-n", peer, "addr", "add", ip+"/24", "dev", "eth0")
		n.serve(peer, ip)
		n.counters[ip] = n.countFlows(peer, ip, trPort)
	}
	n.controls = n.countFlows(peer, trPeer3, trControlPort)
	for _, cidr := range []string{"10.0.2.0/24", "10.0.3.0/24"} {
		run(t, "ip", "-n", n.Node, "route", "add", cidr, "via", policyPeerIP, "dev", "peer0")
	}
	// The node's neighbours of the peer are permanent: a frame the
	// programs pass is never lost waiting for ARP, so it is counted.
	var mac string
	if err := celltest.InNS(n.ns[peer], func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err == nil {
			mac = ifc.HardwareAddr.String()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{policyPeerIP, trDenied} {
		run(t, "ip", "-n", n.Node, "neigh", "replace", ip, "lladdr", mac, "dev", "peer0", "nud", "permanent")
	}
	return n
}

// start starts the agent on the files and waits until that many pod
// devices carry the programs.
func (n *transitionNode) start(files map[string]string, pods int, extra ...string) {
	n.t.Helper()
	n.agent, n.dir = n.startAgent(files, extra...)
	waitAttached(n.agent, pods)
	n.t.Cleanup(func() {
		if n.t.Failed() {
			n.diagnose()
		}
	})
}

// write replaces (or adds) a file of the policy-endpoints directory, by a
// temporary file renamed over it.
func (n *transitionNode) write(name, content string) {
	n.t.Helper()
	WriteFileAtomic(n.t, filepath.Join(n.dir, name+".yaml"), content)
}

// diagnose logs what the agent and the kernel hold: the versions, the
// entries, the keys, health.
func (n *transitionNode) diagnose() {
	for _, args := range [][]string{
		{"shell", "--", "db/show", "policy-versions"},
		{"shell", "--", "db/show", "policy-map-entries"},
		{"shell", "--", "db/show", "cluster-policy-map-entries"},
		{"bpf", "policy", "list"},
	} {
		out, errOut, err := n.agent.Dbg(args...)
		n.t.Logf("enimasq-dbg %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	_, body, err := n.agent.Get("/healthz")
	n.t.Logf("/healthz: %v\n%s", err, body)
}

// trCounter counts the UDP datagrams that reach an address's port, on
// a socket with a receive buffer large enough for a flood.
type trCounter struct{ n atomic.Int64 }

func (n *transitionNode) countFlows(ns, ip string, port int) *trCounter {
	n.t.Helper()
	c := &trCounter{}
	if err := celltest.InNS(n.ns[ns], func() error {
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(ip), Port: port})
		if err != nil {
			return err
		}
		n.t.Cleanup(func() { u.Close() })
		raw, err := u.SyscallConn()
		if err != nil {
			return err
		}
		raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20) })
		go func() {
			buf := make([]byte, 2048)
			for {
				if _, _, err := u.ReadFrom(buf); err != nil {
					return
				}
				c.n.Add(1)
			}
		}()
		return nil
	}); err != nil {
		n.t.Fatalf("count datagrams to %s:%d: %v", ip, port, err)
	}
	return c
}

// rcvbufErrors is the peer's Udp RcvbufErrors: datagrams that reached a
// socket and were dropped for want of room (they would not be counted).
func (n *transitionNode) rcvbufErrors() int64 {
	n.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", n.peerNS(), "cat", "/proc/net/snmp").Output()
	if err != nil {
		n.t.Fatalf("the peer's /proc/net/snmp: %v", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == "RcvbufErrors" && i < len(f) {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				return v
			}
		}
	}
	return 0
}

// sendNewFlows sends count datagrams from the pod to dst:trPort, each from
// a socket of its own (a new source port: a new flow, judged by the maps,
// never by a tracked connection).
func (n *transitionNode) sendNewFlows(pod, dst string, count int) {
	n.t.Helper()
	if err := celltest.InNS(n.ns[n.podNS(pod)], func() error {
		for range count {
			c, err := net.Dial("udp4", net.JoinHostPort(dst, strconv.Itoa(trPort)))
			if err != nil {
				return err
			}
			_, err = c.Write([]byte("new flow"))
			c.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		n.t.Fatalf("new flows from %s to %s: %v", pod, dst, err)
	}
}

// expectFlows sends count new flows from the pod to each destination and
// checks how many reached the peer: all of them (allowed) or none
// (denied). The allowed ones are the control: once they are in, the
// denied ones sent before them had their chance to arrive.
func (n *transitionNode) expectFlows(when, pod string, count int, allowed, denied []string) {
	n.t.Helper()
	before := map[string]int64{}
	for ip, c := range n.counters {
		before[ip] = c.n.Load()
	}
	for _, dst := range denied {
		n.sendNewFlows(pod, dst, count)
	}
	for _, dst := range allowed {
		n.sendNewFlows(pod, dst, count)
	}
	deadline := time.Now().Add(3 * time.Second)
	for _, dst := range allowed {
		for n.counters[dst].n.Load()-before[dst] < int64(count) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(100 * time.Millisecond)
	for _, dst := range allowed {
		if got := n.counters[dst].n.Load() - before[dst]; got != int64(count) {
			n.t.Errorf("%s: %s -> %s (allowed): %d new flows sent, %d reached the peer", when, pod, dst, count, got)
		}
	}
	for _, dst := range denied {
		if got := n.counters[dst].n.Load() - before[dst]; got != 0 {
			n.t.Errorf("%s: %s -> %s (denied): %d new flows sent, %d reached the peer, want 0", when, pod, dst, count, got)
		} else {
			n.t.Logf("%s: %s -> %s denied: %d new flows sent, 0 passed", when, pod, dst, count)
		}
	}
}

// tierVersions is a tier's column of a policy-versions row, as statedb
// dump prints it.
type tierVersions struct {
	Active, Prev, Want uint32
	Rows               int
	Failed             string
}

type podVersionsRow struct {
	Pod           string
	NetworkPolicy tierVersions
	Cluster       tierVersions
	Status        struct {
		Kind  string  `json:"kind"`
		Error *string `json:"error"`
	}
}

// versions is the pod's policy-versions row (ok false: none).
func (n *transitionNode) versions(pod string) (podVersionsRow, bool) {
	n.t.Helper()
	for _, r := range n.agent.Rows("policy-versions") {
		b, _ := json.Marshal(r)
		var row podVersionsRow
		if err := json.Unmarshal(b, &row); err != nil {
			n.t.Fatalf("a policy-versions row: %v\n%s", err, b)
		}
		if row.Pod == pod {
			return row, true
		}
	}
	return podVersionsRow{}, false
}

// settled says whether a tier's newest version is in force, the one before
// gone, and the row in the kernel.
func (r podVersionsRow) settled(tier func(podVersionsRow) tierVersions) bool {
	tv := tier(r)
	return tv.Active != 0 && tv.Active == tv.Want && tv.Prev == 0 && tv.Failed == "" && r.Status.Kind == "Done"
}

func networkPolicyTier(r podVersionsRow) tierVersions { return r.NetworkPolicy }
func clusterTier(r podVersionsRow) tierVersions       { return r.Cluster }

// waitNewVersion waits until a version of the pod's tier newer than after
// is in force, settled, and returns it.
func (n *transitionNode) waitNewVersion(what, pod string, tier func(podVersionsRow) tierVersions, after uint32) uint32 {
	n.t.Helper()
	var row podVersionsRow
	n.agent.WaitFor(what, func() bool {
		var ok bool
		row, ok = n.versions(pod)
		return ok && row.settled(tier) && tier(row).Active > after
	})
	return tier(row).Active
}

// rawFlood sends frames of new UDP flows from a pod through AF_PACKET, a
// new source port each: to dst:trPort, and every controlEvery-th to
// control:trControlPort instead; perMs frames, then a pause of a
// millisecond (perMs 0: as fast as the socket takes them).
type rawFlood struct {
	sent, controls atomic.Int64
	done           chan struct{}
	finished       chan error
}

func (n *transitionNode) floodNewFlows(pod, device, podIP, dst, control string, controlEvery, perMs int) *rawFlood {
	n.t.Helper()
	l := n.podLink(pod, device)
	frame := func(to string, port uint16) []byte {
		return ethernetFrame(l.gw, l.mac, 0x0800, 0, ipv4Packet(netip.MustParseAddr(podIP), netip.MustParseAddr(to), 17,
			udpDatagram(0, port, []byte("flood"))))
	}
	denied, ctl := frame(dst, trPort), frame(control, trControlPort)
	const sportAt = 14 + 20 // Ethernet, IPv4 without options
	f := &rawFlood{done: make(chan struct{}), finished: make(chan error, 1)}
	ready := make(chan error, 1)
	go func() {
		f.finished <- celltest.InNS(n.ns[n.podNS(pod)], func() error {
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
			if err != nil {
				ready <- err
				return err
			}
			defer unix.Close(fd)
			sa := &unix.SockaddrLinklayer{Ifindex: l.ifindex, Halen: 6}
			copy(sa.Addr[:], l.gw)
			ready <- nil
			for i := 0; ; i++ {
				if i%256 == 0 {
					select {
					case <-f.done:
						return nil
					default:
					}
				}
				b := denied
				if controlEvery > 0 && i%controlEvery == controlEvery-1 {
					b = ctl
				}
				binary.BigEndian.PutUint16(b[sportAt:], uint16(1024+i%64000))
				if err := unix.Sendto(fd, b, 0, sa); err != nil {
					if err == unix.ENOBUFS || err == unix.EAGAIN {
						continue
					}
					return err
				}
				if controlEvery > 0 && i%controlEvery == controlEvery-1 {
					f.controls.Add(1)
				} else {
					f.sent.Add(1)
				}
				if perMs > 0 && i%perMs == perMs-1 {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}()
	if err := <-ready; err != nil {
		n.t.Fatalf("flood from %s: %v", pod, err)
	}
	return f
}

// stop ends the flood: frames to dst and to control sent.
func (f *rawFlood) stop(t *testing.T) (sent, controls int64) {
	t.Helper()
	close(f.done)
	if err := <-f.finished; err != nil {
		t.Fatalf("flood: %v", err)
	}
	return f.sent.Load(), f.controls.Load()
}

// rxPackets is the rx_packets of a device of the node: frames the pod put
// on its veth that reached the programs.
func (n *transitionNode) rxPackets(device string) int64 {
	n.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", n.Node, "cat", "/sys/class/net/"+device+"/statistics/rx_packets").Output()
	if err != nil {
		n.t.Fatalf("rx_packets of %s: %v", device, err)
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	return v
}

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
	v2 := policyEndpoint("b", podB, []string{"Egress"}, nil, []peRule{
		{cidr: "10.0.0.0/8", except: []string{"10.0.1.0/24", "10.0.2.0/24"}},
		{cidr: "192.0.2.0/24", ports: []string{"TCP 443"}},
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
