package policybpf

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

// BenchmarkPolicyProgramPerPacket is the cost of the policy program on one
// packet (BPF_PROG_TEST_RUN, 100k runs each), as a ratio to an empty tc
// program: a packet the policy decides (the tracking lookup, the LPM
// lookup among 1,000 peer prefixes, all 24 port entries scanned: denied)
// and a packet of a tracked connection (one hash lookup).
func BenchmarkPolicyProgramPerPacket(b *testing.B) {
	celltest.RequireRoot(b)
	dir := bpf.GlobalsDir(celltest.MountBPFFS(b))
	maps := map[string]*ebpf.Map{}
	for _, d := range []Direction{Egress, Ingress} {
		spec := PolicyMapSpec(d, bpf.IPv4, 65536)
		maps[spec.Name] = openPinnedForTest(b, spec, dir)
	}
	ctSpec, _, err := PolicyStateSpecs()
	if err != nil {
		b.Fatal(err)
	}
	maps[PolicyCTMapName] = openPinnedForTest(b, ctSpec, dir)
	pod, peer := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3")
	// A pod with 1,000 peer prefixes, each with 24 port entries (the AWS
	// agent's most), the packet's port the last.
	entries := make([]PortEntry, 24)
	for i := range entries {
		entries[i] = PortEntry{Protocol: ProtocolTCP, StartPort: uint32(1000 + i)}
	}
	val, _, _ := AllowValue(entries...).Encode()
	for i := range 1000 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 32)
		if i == 0 {
			p = netip.PrefixFrom(peer, 32)
		}
		key, _ := bpf.EncodePolicyKey(pod, p)
		if err := maps[PolicyEgressV4MapName].Put(key, val); err != nil {
			b.Fatal(err)
		}
	}
	prog, err := LoadPolicyProgram(maps)
	if err != nil {
		b.Fatal(err)
	}
	defer prog.Close()
	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer empty.Close()

	const runs = 100_000
	denied, _ := PolicyTestFrame(pod, peer, uint8(ProtocolTCP), 40000, 999)
	allowed, _ := PolicyTestFrame(pod, peer, uint8(ProtocolTCP), 40000, uint16(1000+24-1))
	egress, _ := prog.Programs()
	per := func(p *ebpf.Program, frame []byte) float64 {
		b.Helper()
		_, d, err := p.Benchmark(frame, runs, nil)
		if err != nil {
			b.Fatal(err)
		}
		return float64(d.Nanoseconds())
	}
	for b.Loop() {
		floor := per(empty, denied)
		decided := per(egress, denied)
		tracked := per(egress, allowed) // the first run opens the connection
		b.ReportMetric(floor, "empty-ns/pkt")
		b.ReportMetric(decided, "policy-ns/pkt")
		b.ReportMetric(tracked, "tracked-ns/pkt")
		b.ReportMetric(decided/floor, "policy-x-empty")
		b.ReportMetric(tracked/floor, "tracked-x-empty")
	}
}
