package test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cilium/ebpf"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/test/k8stest"
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
  - hostIP: `+rulesHostIP+`
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

// The 50k-rule benchmark: 50,000 egress rules for one pod in 10
// PolicyEndpoints of 5,000, written at once, then a one-rule PolicyEndpoint
// for another pod (the 10 written concurrently, the one after them).
// load-ms is the time from the first write until the
// kernel map holds both the last big rule and the one-rule policy (read
// from the pinned map, as the verdict program reads it); the verdict
// program is checked on both at the end. The target: 1 s.
const (
	rulesFiles, rulesPerFile = 10, 5000
	rulesPod, rulesOtherPod  = "10.250.0.5", "10.250.0.6"
	// rulesHostIP is the sample CiliumNode's ENI 0 (a node address with
	// the API server as the source).
	rulesHostIP = "10.130.0.10"
)

// BenchmarkProcessPolicy50kRules writes the PolicyEndpoints as files.
func BenchmarkProcessPolicy50kRules(b *testing.B) {
	benchPolicyRules(b, func(b *testing.B, a *Agent) func(name, content string) {
		dir := filepath.Join(a.Dir, "policyendpoints")
		WriteFileAtomic(b, filepath.Join(dir, ".keep"), "")
		a.Args = append(a.Args, "--policy-endpoints-path", dir)
		return func(name, content string) { WriteFileAtomic(b, filepath.Join(dir, name+".yaml"), content) }
	})
}

// BenchmarkProcessPolicy50kRulesFromAPIServer creates them in the API
// server, as the AWS network policy controller does (a create each,
// concurrently). written-ms is how long the API server took to take them.
func BenchmarkProcessPolicy50kRulesFromAPIServer(b *testing.B) {
	c := k8stest.Start(b)
	c.ApplyFile(b, filepath.Join("testdata", "samples", "ciliumnode.yaml"))
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "bench"}}}
	c.MustApply(b, ns)
	benchPolicyRules(b, func(b *testing.B, a *Agent) func(name, content string) {
		a.HostNetwork = true // the API server listens on this netns's loopback
		a.Args = append(a.Args, "--k8s-kubeconfig-path", c.Kubeconfig, "--k8s-node-name", "ip-10-130-0-10.ec2.internal")
		return func(name, content string) {
			objs, err := k8stest.Decode(strings.NewReader(content))
			if err != nil {
				b.Fatal(err)
			}
			for _, obj := range objs {
				if _, err := c.Dynamic().Resource(k8sclient.PolicyEndpoints).Namespace("bench").Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// benchPolicyRules runs the benchmark; source sets the agent up and returns
// how a PolicyEndpoint is written.
func benchPolicyRules(b *testing.B, source func(*testing.B, *Agent) func(name, content string)) {
	contents := make([]string, rulesFiles)
	size := 0
	for f := range rulesFiles {
		contents[f] = rulesPolicyEndpoint(f, rulesPerFile, rulesPod)
		size += len(contents[f])
	}
	one := rulesPolicyEndpoint(99, 1, rulesOtherPod)
	lastPeer := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.%d/32", rulesFiles-1, (rulesPerFile-1)>>8, (rulesPerFile-1)&0xff))
	lastPort := uint16(1000 + (rulesPerFile-1)%60000)
	onePeer := netip.MustParsePrefix("10.99.0.0/32")
	var load, written float64
	for i := range b.N {
		a := NewAgent(b)
		a.Args = append(a.Args, "--enable-network-policy", "--policy-map-max-entries", "262144")
		write := source(b, a)
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
			v, err := bpf.UnmarshalPolicyValue(val, nil)
			return err == nil && v.Search(bpf.PortPoint(bpf.ProtocolTCP, port, true)) >= 0
		}
		start := time.Now()
		var wg sync.WaitGroup
		for f := range rulesFiles {
			wg.Go(func() {
				write(fmt.Sprintf("rules-%d-%d", i, f), strings.ReplaceAll(contents[f], "name: rules-", fmt.Sprintf("name: rules-%d-", i)))
			})
		}
		wg.Wait()
		write(fmt.Sprintf("one-%d", i), strings.ReplaceAll(one, "name: rules-", fmt.Sprintf("name: rules-%d-", i)))
		written = max(written, float64(time.Since(start).Microseconds())/1e3)
		for !allows(rulesPod, lastPeer, lastPort) || !allows(rulesOtherPod, onePeer, 1000) {
			if time.Since(start) > time.Minute {
				b.Fatal("the rules are not in the map after a minute")
			}
			time.Sleep(time.Millisecond)
		}
		load = max(load, float64(time.Since(start).Microseconds())/1e3)
		m.Close()
		for _, q := range [][]string{
			{"--pod", rulesPod, "--peer", lastPeer.Addr().String(), "--port", fmt.Sprint(lastPort)},
			{"--pod", rulesOtherPod, "--peer", onePeer.Addr().String(), "--port", "1000"},
		} {
			args := append([]string{"policy", "verdict", "--bpf-root", a.BPFRoot, "--direction", "egress", "--proto", "tcp"}, q...)
			if out := a.MustDbg(args...); !strings.HasPrefix(out, "ALLOW") {
				b.Fatalf("verdict %v: %s", q, out)
			}
		}
		a.Stop()
	}
	b.ReportMetric(load, "load-ms")
	b.ReportMetric(written, "written-ms")
	b.ReportMetric(float64(size)/(1<<20), "files-MB")
}
