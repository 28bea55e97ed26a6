package netpolicy

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/enimasq/enimasq/bpf"
)

// bigObject is one PolicyEndpoint with many egress rules and pods, shaped
// like the controller's output for a large policy: a /24 per rule, every
// fourth with an except, one or two ports each, under a 10.0.0.0/8 rule and
// a 0.0.0.0/0 rule that excepts it; two ingress rules. Pod i is
// 100.64.0.0 + i, on node 100.127.0.1.
func bigObject(name string, rules, pods int) *PolicyEndpoint {
	pe := &PolicyEndpoint{
		Namespace: "bench", Name: name, PolicyRef: "bench/" + name,
		IsolatesIngress: true, IsolatesEgress: true,
	}
	host := netip.MustParseAddr("100.127.0.1")
	for i := range pods {
		pe.Pods = append(pe.Pods, PodEndpoint{Name: fmt.Sprintf("pod-%d", i), Namespace: "bench",
			PodIP: netip.AddrFrom4([4]byte{100, 64 + byte(i>>16), byte(i >> 8), byte(i)}), HostIP: host})
	}
	pe.Egress = append(pe.Egress,
		Rule{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Except: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			Ports: []Port{{Protocol: bpf.ProtocolTCP, Port: 443}}},
		Rule{CIDR: netip.MustParsePrefix("10.0.0.0/8"), Ports: []Port{{Protocol: bpf.ProtocolUDP, Port: 53}}})
	for i := range rules - 2 {
		base := [4]byte{10 + byte(i>>16), byte(i >> 8), byte(i), 0} // 10.x.y.0/24, then 11.x.y.0/24
		r := Rule{CIDR: netip.PrefixFrom(netip.AddrFrom4(base), 24),
			Ports: []Port{{Protocol: bpf.ProtocolTCP, Port: uint16(1000 + i%50)}}}
		if i%4 == 0 {
			ex := base
			ex[3] = 128
			r.Except = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4(ex), 25)}
		}
		if i%10 == 0 {
			r.Ports = append(r.Ports, Port{Protocol: bpf.ProtocolTCP, Port: 8000, EndPort: 8100})
		}
		pe.Egress = append(pe.Egress, r)
	}
	pe.Ingress = []Rule{
		{CIDR: netip.MustParsePrefix("172.16.0.0/12"), Except: []netip.Prefix{netip.MustParsePrefix("172.16.1.0/24")},
			Ports: []Port{{Protocol: bpf.ProtocolTCP, Port: 8080}}},
		{CIDR: netip.MustParsePrefix("100.64.0.0/10")},
	}
	return pe
}

// BenchmarkPolicyCompileScaling compiles one pod of a PolicyEndpoint with
// 5,000 and with 50,000 egress rules, alternately in the same run:
// ms-5k and ms-50k are the times of one compile (template and stamp), and
// ratio their quotient: 10 for linear scaling.
func BenchmarkPolicyCompileScaling(b *testing.B) {
	small, large := bigObject("small", 5000, 1), bigObject("large", 50000, 1)
	pod := small.Pods[0].PodIP
	var ts, tl time.Duration
	var n5, n50 int
	for b.Loop() {
		runtime.GC()
		start := time.Now()
		n5 = len(CompilePod(pod, []*PolicyEndpoint{small}))
		ts += time.Since(start)
		runtime.GC()
		start = time.Now()
		n50 = len(CompilePod(pod, []*PolicyEndpoint{large}))
		tl += time.Since(start)
	}
	b.ReportMetric(float64(ts.Microseconds())/1e3/float64(b.N), "ms-5k")
	b.ReportMetric(float64(tl.Microseconds())/1e3/float64(b.N), "ms-50k")
	b.ReportMetric(float64(tl)/float64(ts), "ratio")
	b.ReportMetric(float64(n5), "entries-5k")
	b.ReportMetric(float64(n50), "entries-50k")
}
