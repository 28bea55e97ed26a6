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
	"github.com/enimasq/enimasq/bpf/policybpf"
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
// Read from the pinned map, as the verdict program reads it: one-ms is
// the time from the one-rule policy's write until the kernel map holds
// it (its target: 0.1 s: a small policy never queues behind a large
// one); burst-ms the time from the first write until the map holds every
// one of the 50,000 rules; load-ms until it holds both. one-source-ms
// (files only) is the part of one-ms until the agent applied the one-rule
// file to policy-endpoints, from its log: the rest is compiling, writing
// and reconciling. Each is the slowest of the runs. The verdict program
// is checked on the last big rule and the one rule at the end. The
// issue's target for the burst: 1 s.
const (
	rulesFiles, rulesPerFile = 10, 5000
	rulesPod, rulesOtherPod  = "10.250.0.5", "10.250.0.6"
	// rulesHostIP is the sample CiliumNode's ENI 0 (a node address with
	// the API server as the source).
	rulesHostIP = "10.130.0.10"
)

// clusterRulesPolicyEndpoints are the ClusterPolicyEndpoints of the
// benchmark: objects of perObject rules each, for pod's egress, the Admin
// tier at priorities 1..objects, Deny and Accept in turn, each rule to
// its own /32 peer (172.16.o.r) on its own TCP port.
func clusterRulesPolicyEndpoints(objects, perObject int, pod string) string {
	var b strings.Builder
	for o := range objects {
		action := "Deny"
		if o%2 == 1 {
			action = "Accept"
		}
		fmt.Fprintf(&b, `---
apiVersion: networking.k8s.aws/v1alpha1
kind: ClusterPolicyEndpoint
metadata:
  name: cluster-rules-%d
spec:
  policyRef:
    name: cluster-rules-%d
  tier: Admin
  priority: %d
  podSelectorEndpoints:
  - hostIP: `+rulesHostIP+`
    podIP: %s
    name: pod
    namespace: bench
  egress:
`, o, o, o+1, pod)
		for r := range perObject {
			fmt.Fprintf(&b, "  - cidr: 172.16.%d.%d/32\n    action: %s\n    ports:\n    - protocol: TCP\n      port: %d\n", o, r, action, 2000+r)
		}
	}
	return b.String()
}

// The ClusterPolicyEndpoints written with the files' burst: 1,000 rules.
const clusterObjects, clusterRulesPerObject = 10, 100

// BenchmarkProcessPolicy50kRules writes the PolicyEndpoints as files, and
// 1,000 ClusterPolicyEndpoint rules with them (cluster-ms: every one in the
// cluster map; all-ms: both, from the first write).
func BenchmarkProcessPolicy50kRules(b *testing.B) {
	benchPolicyRules(b, clusterObjects*clusterRulesPerObject, func(b *testing.B, a *Agent) func(name, content string) {
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
	benchPolicyRules(b, 0, func(b *testing.B, a *Agent) func(name, content string) {
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

// benchPolicyRules runs the benchmark, with clusterRules
// ClusterPolicyEndpoint rules written with the burst (0: none); source
// sets the agent up and returns how an object is written.
func benchPolicyRules(b *testing.B, clusterRules int, source func(*testing.B, *Agent) func(name, content string)) {
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
	// Every rule of the burst, in the order of their peers (the order the
	// agent writes them in, about).
	type rule struct {
		peer netip.Prefix
		port uint16
	}
	var burst []rule
	for f := range rulesFiles {
		for r := range rulesPerFile {
			burst = append(burst, rule{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(f), byte(r >> 8), byte(r)}), 32), uint16(1000 + r%60000)})
		}
	}
	cluster := ""
	if clusterRules > 0 {
		cluster = clusterRulesPolicyEndpoints(clusterObjects, clusterRulesPerObject, rulesPod)
		size += len(cluster)
	}
	var load, written, oneLatency, oneSource, burstLoad, clusterLoad, allLoad float64
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	for i := range b.N {
		a := NewAgent(b)
		a.Args = append(a.Args, "--enable-network-policy", "--policy-map-max-entries", "262144")
		write := source(b, a)
		a.Start()
		a.WaitHealthy()
		var m, cm, vm *ebpf.Map
		a.WaitFor("the egress maps pinned", func() bool {
			var err error
			m, err = ebpf.LoadPinnedMap(filepath.Join(bpf.GlobalsDir(a.BPFRoot), policybpf.PolicyEgressV4MapName), &ebpf.LoadPinOptions{ReadOnly: true})
			if err != nil {
				return false
			}
			cm, err = ebpf.LoadPinnedMap(filepath.Join(bpf.GlobalsDir(a.BPFRoot), policybpf.ClusterEgressV4MapName), &ebpf.LoadPinOptions{ReadOnly: true})
			if err != nil {
				m.Close()
				return false
			}
			vm, err = ebpf.LoadPinnedMap(filepath.Join(bpf.GlobalsDir(a.BPFRoot), policybpf.PolicyVersionsMapName), &ebpf.LoadPinOptions{ReadOnly: true})
			if err != nil {
				m.Close()
				cm.Close()
			}
			return err == nil
		})
		// A rule is in force once it is in the version of its pod's
		// policy that enimasq_policy_versions says is in force (tier 0:
		// NetworkPolicy, 1: cluster); a pod without a version has none.
		inForce := func(pod string, tier int, peer netip.Prefix) ([]byte, bool) {
			addr := netip.MustParseAddr(pod)
			v := make([]byte, policybpf.PolicyVersionValueSize)
			if vm.Lookup(policybpf.PolicyPodKey(addr), v) != nil {
				return nil, false
			}
			np, cl, err := policybpf.DecodePolicyVersions(v)
			if err != nil {
				return nil, false
			}
			version := [2]uint32{np, cl}[tier]
			if version == 0 || version == policybpf.PolicyVersionClosed {
				return nil, false
			}
			key, err := bpf.AppendPolicyKeyVersion(nil, addr, version, peer)
			return key, err == nil
		}
		// A cluster rule is in once the pod's key of its peer has an
		// interval for its port (the root's value has none).
		clusterHolds := func(o, r int) bool {
			key, ok := inForce(rulesPod, 1, netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16, byte(o), byte(r)}), 32))
			val := make([]byte, policybpf.PolicyValueSize)
			if !ok || cm.Lookup(key, val) != nil {
				return false
			}
			v, err := policybpf.UnmarshalPolicyValue(val, nil)
			return err == nil && v.Search(policybpf.PortPoint(policybpf.ProtocolTCP, uint16(2000+r), true)) >= 0
		}
		allows := func(pod string, peer netip.Prefix, port uint16) bool {
			key, ok := inForce(pod, 0, peer)
			val := make([]byte, policybpf.PolicyValueSize)
			if !ok || m.Lookup(key, val) != nil {
				return false
			}
			v, err := policybpf.UnmarshalPolicyValue(val, nil)
			return err == nil && v.Search(policybpf.PortPoint(policybpf.ProtocolTCP, port, true)) >= 0
		}
		start := time.Now()
		var wg sync.WaitGroup
		for f := range rulesFiles {
			wg.Go(func() {
				write(fmt.Sprintf("rules-%d-%d", i, f), strings.ReplaceAll(contents[f], "name: rules-", fmt.Sprintf("name: rules-%d-", i)))
			})
		}
		if cluster != "" {
			wg.Go(func() {
				write(fmt.Sprintf("cluster-%d", i), strings.ReplaceAll(cluster, "name: cluster-rules-", fmt.Sprintf("name: cluster-rules-%d-", i)))
			})
		}
		wg.Wait()
		oneStart := time.Now()
		write(fmt.Sprintf("one-%d", i), strings.ReplaceAll(one, "name: rules-", fmt.Sprintf("name: rules-%d-", i)))
		written = max(written, ms(time.Since(start)))
		// The burst is in once every rule has been seen: a cursor over
		// them stops at the first one missing, so that a poll costs a
		// lookup or two until the rules come (they are not removed).
		var oneAt, burstAt, clusterAt time.Duration
		next, nextCluster := 0, 0
		if cluster == "" {
			clusterAt = -1
		}
		for oneAt == 0 || burstAt == 0 || clusterAt == 0 {
			if time.Since(start) > time.Minute {
				b.Fatalf("the rules are not in the map after a minute: the one rule %v, %d of the burst's", oneAt != 0, next)
			}
			if oneAt == 0 && allows(rulesOtherPod, onePeer, 1000) {
				oneAt = time.Since(oneStart)
			}
			for burstAt == 0 && allows(rulesPod, burst[next].peer, burst[next].port) {
				if next++; next == len(burst) {
					burstAt = time.Since(start)
				}
			}
			for clusterAt == 0 && clusterHolds(nextCluster/clusterRulesPerObject, nextCluster%clusterRulesPerObject) {
				if nextCluster++; nextCluster == clusterRules {
					clusterAt = time.Since(start)
				}
			}
			time.Sleep(time.Millisecond)
		}
		oneLatency, burstLoad = max(oneLatency, ms(oneAt)), max(burstLoad, ms(burstAt))
		load = max(load, ms(max(oneAt+oneStart.Sub(start), burstAt)))
		if clusterAt > 0 {
			clusterLoad = max(clusterLoad, ms(clusterAt))
			allLoad = max(allLoad, ms(max(burstAt, clusterAt)))
		}
		m.Close()
		cm.Close()
		vm.Close()
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
		// Of one-ms, the source's part: until the read of the
		// directory that applied the one-rule file (the agent's log,
		// to the millisecond).
		if at, ok := appliedAt(a.Log(), rulesFiles+1); ok {
			oneSource = max(oneSource, ms(at.Sub(oneStart.Round(0))))
			b.Logf("run %d: the one rule in the kernel %s after its write (in policy-endpoints after %s), the burst %s after the first write",
				i, oneAt.Round(time.Millisecond), at.Sub(oneStart.Round(0)).Round(time.Millisecond), burstAt.Round(time.Millisecond))
		}
	}
	if oneSource > 0 {
		b.ReportMetric(oneSource, "one-source-ms")
	}
	b.ReportMetric(oneLatency, "one-ms")
	b.ReportMetric(burstLoad, "burst-ms")
	if clusterRules > 0 {
		b.ReportMetric(clusterLoad, "cluster-ms")
		b.ReportMetric(allLoad, "all-ms")
	}
	b.ReportMetric(load, "load-ms")
	b.ReportMetric(written, "written-ms")
	b.ReportMetric(float64(size)/(1<<20), "files-MB")
}

// appliedAt is the time of the agent's first "Applied PolicyEndpoints" log
// line that counts n PolicyEndpoints.
func appliedAt(log string, n int) (time.Time, bool) {
	want := fmt.Sprintf(`summary="%d PolicyEndpoints `, n)
	for line := range strings.Lines(log) {
		if !strings.Contains(line, `msg="Applied PolicyEndpoints"`) || !strings.Contains(line, want) {
			continue
		}
		stamp, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		t, err := time.Parse(time.RFC3339Nano, stamp)
		return t, err == nil
	}
	return time.Time{}, false
}
