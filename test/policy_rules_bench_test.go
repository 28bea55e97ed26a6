package test

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
)

// rulesPolicyEndpoint is one of the PolicyEndpoints of the 50k-rule
// benchmark: pod's egress to rules distinct /32 peers (10.f.x.y), each on
// its own TCP port.
func rulesPolicyEndpoint(file, rules int, pod string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: networking.k8s.aws/v1alpha1
kind: PolicyEndpoint
metadata:
  name: rules-%d
  namespace: bench
spec:
  policyRef:
    name: rules-%d
    namespace: bench
  podIsolation:
  - Egress
  podSelectorEndpoints:
  - hostIP: 10.255.0.1
    podIP: %s
    name: pod
    namespace: bench
  egress:
`, file, file, pod)
	for i := range rules {
		fmt.Fprintf(&b, "  - cidr: 10.%d.%d.%d/32\n    ports:\n    - protocol: TCP\n      port: %d\n", file, byte(i>>8), byte(i), 1000+i%60000)
	}
	return b.String()
}

// BenchmarkProcessPolicy50kRules: enimasq-agent on an empty PolicyEndpoint
// directory; 50,000 egress rules for one pod in 10 PolicyEndpoint files of
// 5,000, written at once, then a one-rule PolicyEndpoint for another pod.
// load-ms is the time from the first write until the kernel map holds both
// the last big rule and the one-rule policy (read from the pinned map, as
// the verdict program reads it); the verdict program is checked on both at
// the end. The target: 1 s.
func BenchmarkProcessPolicy50kRules(b *testing.B) {
	const files, rules = 10, 5000
	pod, other := "10.250.0.5", "10.250.0.6"
	contents := make([]string, files)
	size := 0
	for f := range files {
		contents[f] = rulesPolicyEndpoint(f, rules, pod)
		size += len(contents[f])
	}
	one := rulesPolicyEndpoint(99, 1, other)
	lastPeer := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.%d/32", files-1, (rules-1)>>8, (rules-1)&0xff))
	lastPort := uint16(1000 + (rules-1)%60000)
	onePeer := netip.MustParsePrefix("10.99.0.0/32")
	var load float64
	for range b.N {
		a := NewAgent(b)
		dir := filepath.Join(a.Dir, "policyendpoints")
		WriteFileAtomic(b, filepath.Join(dir, ".keep"), "")
		a.Args = append(a.Args, "--enable-network-policy", "--policy-endpoints-path", dir, "--policy-map-max-entries", "262144")
		a.Start()
		a.WaitHealthy()
		var m *ebpf.Map
		a.WaitFor("the egress map pinned", func() bool {
			var err error
			m, err = ebpf.LoadPinnedMap(filepath.Join(bpf.GlobalsDir(a.BPFRoot), bpf.PolicyEgressV4MapName), &ebpf.LoadPinOptions{ReadOnly: true})
			return err == nil
		})
		allows := func(pod string, peer netip.Prefix, port uint16) bool {
			key, _ := bpf.EncodePolicyKey(netip.MustParseAddr(pod), peer)
			val := make([]byte, bpf.PolicyValueSize)
			if m.Lookup(key, val) != nil {
				return false
			}
			v, err := bpf.UnmarshalPolicyValue(val)
			return err == nil && v.Match(bpf.ProtocolTCP, port, true) >= 0
		}
		start := time.Now()
		for f := range files {
			WriteFileAtomic(b, filepath.Join(dir, fmt.Sprintf("rules-%d.yaml", f)), contents[f])
		}
		WriteFileAtomic(b, filepath.Join(dir, "one.yaml"), one)
		for !allows(pod, lastPeer, lastPort) || !allows(other, onePeer, 1000) {
			if time.Since(start) > time.Minute {
				b.Fatal("the rules are not in the map after a minute")
			}
			time.Sleep(time.Millisecond)
		}
		load = max(load, float64(time.Since(start).Microseconds())/1e3)
		m.Close()
		for _, q := range [][]string{
			{"--pod", pod, "--peer", lastPeer.Addr().String(), "--port", fmt.Sprint(lastPort)},
			{"--pod", other, "--peer", onePeer.Addr().String(), "--port", "1000"},
		} {
			args := append([]string{"policy", "verdict", "--direction", "egress", "--proto", "tcp"}, q...)
			if out := a.MustDbg(args...); !strings.HasPrefix(out, "ALLOW") {
				b.Fatalf("verdict %v: %s", q, out)
			}
		}
		a.Stop()
	}
	b.ReportMetric(load, "load-ms")
	b.ReportMetric(float64(size)/(1<<20), "files-MB")
}
