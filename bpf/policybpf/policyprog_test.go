package policybpf

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

func TestPrivilegedPolicyProgram(t *testing.T) {
	dir := bpf.GlobalsDir(celltest.MountBPFFS(t))
	maps := map[string]*ebpf.Map{}
	for _, d := range []Direction{Egress, Ingress} {
		for _, f := range []bpf.Family{bpf.IPv4, bpf.IPv6} {
			spec := PolicyMapSpec(d, f, 1024) // not the program's size: the loader adapts
			maps[spec.Name] = openPinnedForTest(t, spec, dir)
		}
	}
	put := func(mapName, pod, peer string, entries ...PortEntry) {
		t.Helper()
		key, err := bpf.EncodePolicyKey(netip.MustParseAddr(pod), netip.MustParsePrefix(peer))
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := AllowValue(entries...).Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := maps[mapName].Put(key, b); err != nil {
			t.Fatalf("put %s %s %s: %v", mapName, pod, peer, err)
		}
	}
	pod4, pod6 := "10.0.0.5", "2001:db8::5"
	put(PolicyEgressV4MapName, pod4, "0.0.0.0/0")
	put(PolicyEgressV4MapName, pod4, "10.0.0.0/8", PortEntry{Protocol: ProtocolUDP, StartPort: 53})
	put(PolicyEgressV4MapName, pod4, "10.130.0.0/16")
	put(PolicyEgressV4MapName, pod4, "10.130.112.20/32", PortEntry{Protocol: ProtocolTCP, StartPort: 8000, EndPort: 8080})
	put(PolicyIngressV4MapName, pod4, "0.0.0.0/0", AnyPortEntry)
	put(PolicyEgressV6MapName, pod6, "::/0")
	put(PolicyEgressV6MapName, pod6, "2001:db8:1::/48", PortEntry{Protocol: ProtocolSCTP}, PortEntry{Protocol: ProtocolTCP, StartPort: 443})

	prog, err := LoadPolicyProgram(maps)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()

	for _, tc := range []struct {
		dir       Direction
		src, dst  string
		proto     uint32
		port      uint16
		allow     bool
		reason    PolicyReason
		portEntry int
	}{
		{Egress, pod4, "10.1.2.3", ProtocolUDP, 53, true, PolicyAllowed, 0},
		{Egress, pod4, "10.1.2.3", ProtocolTCP, 53, false, PolicyDenied, -1},
		{Egress, pod4, "10.130.1.1", ProtocolUDP, 53, false, PolicyDenied, -1},
		{Egress, pod4, "10.130.112.20", ProtocolTCP, 8080, true, PolicyAllowed, 0},
		{Egress, pod4, "10.130.112.20", ProtocolTCP, 8081, false, PolicyDenied, -1},
		{Egress, pod4, "8.8.8.8", ProtocolUDP, 53, false, PolicyDenied, -1},
		{Egress, pod4, "10.1.2.3", 1, 0, false, PolicyDenied, -1},
		{Egress, "10.0.0.6", "8.8.8.8", ProtocolTCP, 80, true, PolicyNoPolicy, -1},
		// Ingress: the pod is the destination.
		{Ingress, "8.8.8.8", pod4, ProtocolTCP, 22, true, PolicyAllowed, 0},
		{Ingress, pod4, "8.8.8.8", ProtocolTCP, 22, true, PolicyNoPolicy, -1},
		{Egress, pod6, "2001:db8:1::9", ProtocolTCP, 443, true, PolicyAllowed, 0}, // intervals sort by protocol
		{Egress, pod6, "2001:db8:1::9", ProtocolSCTP, 9, true, PolicyAllowed, 1},
		{Egress, pod6, "2001:db8:2::9", ProtocolTCP, 443, false, PolicyDenied, -1},
	} {
		frame, err := PolicyTestFrame(netip.MustParseAddr(tc.src), netip.MustParseAddr(tc.dst), uint8(tc.proto), 40000, tc.port)
		if err != nil {
			t.Fatal(err)
		}
		res, err := prog.Run(tc.dir, frame)
		if err != nil {
			t.Fatal(err)
		}
		step := StepNamespace
		if tc.reason == PolicyNoPolicy {
			step = StepDefault
		}
		want := PolicyResult{Allow: tc.allow, Reason: tc.reason, Step: step, Interval: tc.portEntry}
		if res != want {
			t.Errorf("%s %s -> %s %s/%d: %+v, want %+v", tc.dir, tc.src, tc.dst, ProtocolName(tc.proto), tc.port, res, want)
		}
	}

	// An EtherType the programs do not judge: dropped; ARP passes.
	res, err := prog.Run(Egress, make([]byte, 64))
	if err != nil || res.Allow || res.Reason != PolicyMalformed {
		t.Errorf("EtherType 0 frame: %+v %v, want dropped as malformed", res, err)
	}
	arp := make([]byte, 42)
	arp[12], arp[13] = 0x08, 0x06
	if res, err := prog.Run(Egress, arp); err != nil || !res.Allow || res.Reason != PolicyARP {
		t.Errorf("ARP frame: %+v %v, want passed", res, err)
	}
}

func TestPrivilegedPolicyProgramPlaceholderMaps(t *testing.T) {
	celltest.RequireRoot(t)
	prog, err := LoadPolicyProgram(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	frame, _ := PolicyTestFrame(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), uint8(ProtocolTCP), 1, 2)
	res, err := prog.Run(Egress, frame)
	if err != nil || !res.Allow || res.Reason != PolicyNoPolicy {
		t.Errorf("%+v %v", res, err)
	}
}
