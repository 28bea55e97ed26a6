package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// The cluster property tests generate random PolicyEndpoints and
// ClusterPolicyEndpoints (both tiers, priorities with ties, Accept, Deny
// and Pass, nested and overlapping cidrs, ports and ranges, rules without
// ports, the node IP inside and outside the rules, stand-ins of unreadable
// objects) and random packets, and compare a reference evaluator written
// from the rules (clusterOracle: it walks the raw objects, never the
// compiler's output) with the compiled entries evaluated as the program
// does (policybpf.EvaluatePolicy) and, in the privileged test, with the real
// verdict program.
//
// The rules, the AWS agent v1.5.0's order:
//  1. Admin tier: of the Admin rules that hold the packet (cidr, ports),
//     the lowest priority number wins, at one priority Deny over Accept
//     over Pass; Accept and Deny decide, Pass goes on. The node IP is
//     accepted first, and a stand-in (an unreadable object without a last
//     good version) denies its pods everything else, in both directions.
//  2. NetworkPolicy: a pod isolated in the direction by a PolicyEndpoint
//     is allowed what some rule of it allows (and its node IP), denied the
//     rest.
//  3. Baseline tier, only for a pod no PolicyEndpoint isolates in the
//     direction: as the Admin tier.
//  4. Default: allowed; in strict mode denied to a pod IP no
//     PolicyEndpoint selects (a selected pod's direction that no
//     NetworkPolicy isolates is allowed, as the AWS agent's DEFAULT_ALLOW).

// oracleVerdict is what the rules decide for a packet: the verdict, the
// step, and the objects whose rule may be the deciding one (Admin and
// Baseline steps; nil: not compared).
type oracleVerdict struct {
	allow   bool
	step    policybpf.PolicyStep
	objects []uint32
	why     string
}

func (v oracleVerdict) String() string {
	verdict := "DENY"
	if v.allow {
		verdict = "ALLOW"
	}
	return fmt.Sprintf("%s at %s (%s)", verdict, v.step, v.why)
}

// cpeID is the id the program names a ClusterPolicyEndpoint by (the
// documented ObjectID of kind ClusterPolicyEndpoint and its name).
func cpeID(name string) uint32 { return policybpf.ObjectID("ClusterPolicyEndpoint", name) }

// clusterPortsMatch says whether a rule's ports hold the packet: no ports
// hold everything (ICMP too); a spec holds its protocol (none: TCP) on its
// port, its range, or every port.
func clusterPortsMatch(ports []rawPort, p packet) bool {
	if len(ports) == 0 {
		return true
	}
	for _, port := range ports {
		proto := map[string]uint32{"": policybpf.ProtocolTCP, "TCP": policybpf.ProtocolTCP, "UDP": policybpf.ProtocolUDP, "SCTP": policybpf.ProtocolSCTP}[port.Protocol]
		if proto != p.Proto {
			continue
		}
		switch {
		case port.Port == 0:
			return true
		case port.EndPort == 0:
			if int(p.Port) == port.Port {
				return true
			}
		case int(p.Port) >= port.Port && int(p.Port) <= port.EndPort:
			return true
		}
	}
	return false
}

// tierWinner is the winner of a tier for the packet among the objects that
// select the pod: the lowest priority, then Deny, Accept, Pass; with the
// names of the objects that have a rule of that priority and action
// holding the packet. ok false: no rule holds it.
func tierWinner(cpes []rawCPE, tier string, p packet) (action string, priority int, objects []uint32, ok bool) {
	rank := map[string]int{"Deny": 0, "Accept": 1, "Pass": 2}
	best := [2]int{1 << 30, 3}
	for _, c := range cpes {
		if c.StandIn || c.Tier != tier {
			continue
		}
		rules := c.Egress
		if p.Dir == policybpf.Ingress {
			rules = c.Ingress
		}
		for _, r := range rules {
			cidr := netip.MustParsePrefix(r.CIDR).Masked()
			if cidr.Addr().Is4() != p.Pod.Is4() || !cidr.Contains(p.Peer) || !clusterPortsMatch(r.Ports, p) {
				continue
			}
			key := [2]int{c.Priority, rank[r.Action]}
			switch {
			case key[0] < best[0] || key[0] == best[0] && key[1] < best[1]:
				best, action, objects = key, r.Action, []uint32{cpeID(c.Name)}
			case key == best && !slices.Contains(objects, cpeID(c.Name)):
				objects = append(objects, cpeID(c.Name))
			}
		}
	}
	return action, best[0], objects, action != ""
}

// clusterOracle decides a packet from the raw scenario by the rules above.
func (s clusterScenario) clusterOracle(node nodeconfig.Config, strict bool, p packet) oracleVerdict {
	dflt := func(selectedByPE bool, why string) oracleVerdict {
		if strict && !selectedByPE {
			return oracleVerdict{step: policybpf.StepDefault, why: why + ", strict mode, no PolicyEndpoint selects the pod"}
		}
		return oracleVerdict{allow: true, step: policybpf.StepDefault, why: why}
	}
	if !node.FamilyEnabled(p.Pod) {
		return dflt(false, "a family the node does not run")
	}
	var cpes []rawCPE
	var pes []rawPE
	isNodeIP := func(pods []rawPod) bool {
		for _, pod := range pods {
			if netip.MustParseAddr(pod.PodIP) == p.Pod {
				h := netip.MustParseAddr(pod.HostIP)
				return h.Is4() == p.Pod.Is4() && h == p.Peer
			}
		}
		return false
	}
	selects := func(pods []rawPod) bool {
		return slices.ContainsFunc(pods, func(pod rawPod) bool { return netip.MustParseAddr(pod.PodIP) == p.Pod })
	}
	// A policy is the union of its slices: the objects that list the pod
	// and every other object of their policies.
	cpePolicies, pePolicies := map[string]bool{}, map[string]bool{}
	for _, c := range s.CPEs {
		if selects(c.Pods) {
			cpePolicies[c.policy()] = true
		}
	}
	for _, pe := range s.NP.PEs {
		if selects(pe.Pods) {
			pePolicies[pe.policy()] = true
		}
	}
	for _, c := range s.CPEs {
		if cpePolicies[c.policy()] {
			cpes = append(cpes, c)
		}
	}
	for _, pe := range s.NP.PEs {
		if pePolicies[pe.policy()] {
			pes = append(pes, pe)
		}
	}

	// 1. Admin.
	for _, c := range cpes {
		if isNodeIP(c.Pods) {
			return oracleVerdict{allow: true, step: policybpf.StepAdmin, objects: []uint32{0}, why: "the node IP"}
		}
	}
	var standIns []uint32
	for _, c := range cpes {
		if c.StandIn {
			standIns = append(standIns, cpeID(c.Name))
		}
	}
	if len(standIns) > 0 {
		return oracleVerdict{step: policybpf.StepAdmin, objects: standIns, why: "a stand-in"}
	}
	if action, prio, objs, ok := tierWinner(cpes, "Admin", p); ok && action != "Pass" {
		return oracleVerdict{allow: action == "Accept", step: policybpf.StepAdmin, objects: objs, why: fmt.Sprintf("Admin %s at %d", action, prio)}
	}

	// 2. NetworkPolicy.
	dir := "Egress"
	if p.Dir == policybpf.Ingress {
		dir = "Ingress"
	}
	isolated := false
	for _, pe := range pes {
		if !slices.Contains(pe.Isolation, dir) {
			continue
		}
		isolated = true
		if isNodeIP(pe.Pods) {
			return oracleVerdict{allow: true, step: policybpf.StepNamespace, why: "the node IP (NetworkPolicy)"}
		}
		rules := pe.Egress
		if p.Dir == policybpf.Ingress {
			rules = pe.Ingress
		}
		for _, r := range rules {
			if ruleAllows(r, p) {
				return oracleVerdict{allow: true, step: policybpf.StepNamespace, why: "a NetworkPolicy rule of " + pe.Name}
			}
		}
	}
	if isolated {
		return oracleVerdict{step: policybpf.StepNamespace, why: "isolated, no NetworkPolicy rule"}
	}

	// 3. Baseline.
	if action, prio, objs, ok := tierWinner(cpes, "Baseline", p); ok && action != "Pass" {
		return oracleVerdict{allow: action == "Accept", step: policybpf.StepBaseline, objects: objs, why: fmt.Sprintf("Baseline %s at %d", action, prio)}
	}

	// 4. Default.
	return dflt(len(pes) > 0, "nothing decides")
}

// agrees says whether a result is the oracle's verdict: allow, step, and
// the deciding object where the oracle names the candidates.
func (v oracleVerdict) agrees(res policybpf.PolicyResult) bool {
	if res.Allow != v.allow || res.Step != v.step {
		return false
	}
	return v.objects == nil || slices.Contains(v.objects, res.Object)
}

// TestClusterCompileMatchesOracle: the compiled NetworkPolicy and cluster
// entries, evaluated as the program does, give the verdict, the step and
// the deciding object of the reference evaluator for thousands of random
// packets on random policies of both kinds, in standard and strict mode,
// on an IPv4-only and on a dual-stack node.
func TestClusterCompileMatchesOracle(t *testing.T) {
	seed := propertySeed(t)
	rng := rand.New(rand.NewPCG(seed, 0xc1))
	scenarios, packets := 2000, 40
	if testing.Short() {
		scenarios = 200
	}
	checked, spilled := 0, 0
	steps := map[policybpf.PolicyStep]int{}
	for i := range scenarios {
		node := nodeconfig.Config{EnableIPv4: true, EnableIPv6: i%2 == 1}
		strict := i%3 == 2
		s := genClusterScenario(rng, true)
		np, cp := compileClusterScenario(t, s, node)
		for _, e := range cp {
			if len(e.Spill()) > 0 {
				spilled++
			}
		}
		for _, p := range genClusterPackets(rng, s, true, packets) {
			want := s.clusterOracle(node, strict, p)
			checked++
			steps[want.step]++
			got := evalClusterEntries(np, cp, strict, p)
			if want.agrees(got) {
				continue
			}
			min := shrinkCluster(s, func(c clusterScenario) bool {
				np, cp := compileClusterScenario(t, c, node)
				return !c.clusterOracle(node, strict, p).agrees(evalClusterEntries(np, cp, strict, p))
			})
			np, cp := compileClusterScenario(t, min, node)
			t.Fatalf("seed %d, scenario %d, dual-stack node %t, strict %t: packet %s: oracle %s, compiled entries %s\n"+
				"minimal case (oracle %s, entries %s):\n%s\nNetworkPolicy entries:\n%s\ncluster entries:\n%s",
				seed, i, node.EnableIPv6, strict, p, want, resultText(got),
				min.clusterOracle(node, strict, p), resultText(evalClusterEntries(np, cp, strict, p)), min.render(),
				strings.Join(entryLines(np), "\n"), strings.Join(clusterEntryLines(cp), "\n"))
		}
	}
	t.Logf("%d packets on %d random policies agree with the oracle (by step: %v; %d cluster entries with chunks)",
		checked, scenarios, steps, spilled)
	if spilled == 0 && !testing.Short() {
		t.Error("no cluster value had chunks: the generator does not reach them")
	}
	for _, st := range policybpf.PolicySteps {
		if steps[st] < 100 && !testing.Short() {
			t.Errorf("only %d packets decided at the %s step: the generator does not reach it", steps[st], st)
		}
	}
}

// TestClusterOracleStrictSelectedPod: in strict mode a pod that a
// PolicyEndpoint selects but does not isolate in a direction is not "a pod
// no policy selects": its traffic in that direction is allowed (the
// documentation of --network-policy-enforcing-mode, and
// test/enforce_test.go TestPrivilegedNetworkPolicyStrictMode, "pod b's
// egress is not isolated by its policy"), with and without a
// ClusterPolicyEndpoint that passes. (It failed before 02e7d2a: the
// default step denied every pod in strict mode.)
func TestClusterOracleStrictSelectedPod(t *testing.T) {
	node := nodeconfig.Config{EnableIPv4: true}
	pod := "10.0.0.2"
	s := clusterScenario{NP: scenario{PEs: []rawPE{{
		Name: "ingress-only", Isolation: []string{"Ingress"},
		Pods:    []rawPod{{PodIP: pod, HostIP: "10.0.0.253"}},
		Ingress: []rawRule{{CIDR: "10.1.0.0/16", Ports: []rawPort{{Protocol: "TCP", Port: 80}}}},
	}}}}
	withPass := s.clone()
	withPass.CPEs = []rawCPE{{Name: "pass", Tier: "Admin", Priority: 5, Pods: []rawPod{{PodIP: pod, HostIP: "10.0.0.253"}},
		Egress: []rawClusterRule{{CIDR: "0.0.0.0/0", Action: "Pass"}}}}
	for name, sc := range map[string]clusterScenario{"PolicyEndpoint only": s, "and an Admin Pass": withPass} {
		np, cp := compileClusterScenario(t, sc, node)
		p := packet{Dir: policybpf.Egress, Pod: netip.MustParseAddr(pod), Peer: netip.MustParseAddr("10.2.0.1"), Proto: policybpf.ProtocolTCP, Port: 443}
		if got := evalClusterEntries(np, cp, true, p); !got.Allow {
			t.Errorf("%s: strict mode, %s (egress not isolated by the pod's PolicyEndpoint): %s, want ALLOW\nentries:\n%s",
				name, p, resultText(got), strings.Join(entryLines(np), "\n"))
		}
	}
}

// TestClusterCompileValuesPastTheShownIntervals: two boundaries whose
// values agree on their first intervals (as many as a row's text shows)
// and differ after them keep their own values. The minimal case the
// oracle found (seed 13136679858202037722): an Admin rule denies eight
// TCP and UDP ports to every peer; 10.0.0.253/32 is also denied SCTP, and
// 10.2.0.0/16 accepted SCTP 1000-1002 (the other way round too: then a
// Deny becomes an Accept).
func TestClusterCompileValuesPastTheShownIntervals(t *testing.T) {
	pods := []rawPod{{PodIP: "10.0.0.3", HostIP: "10.0.0.254"}}
	var many []rawPort
	for i, port := range []int{2009, 2027, 2033, 2072, 2099, 2123, 2162, 2177} {
		many = append(many, rawPort{Protocol: []string{"TCP", "UDP"}[i%2], Port: port})
	}
	node := nodeconfig.Config{EnableIPv4: true}
	for _, actions := range [][2]string{{"Deny", "Accept"}, {"Accept", "Deny"}} {
		s := clusterScenario{CPEs: []rawCPE{{Name: "cpe-0", Tier: "Admin", Priority: 2, Pods: pods, Ingress: []rawClusterRule{
			{CIDR: "10.0.0.253/32", Ports: []rawPort{{Protocol: "SCTP"}}, Action: actions[0]},
			{CIDR: "10.2.0.0/16", Ports: []rawPort{{Protocol: "SCTP", Port: 1000, EndPort: 1002}}, Action: actions[1]},
			{CIDR: "0.0.0.0/0", Ports: many, Action: "Deny"},
		}}}}
		np, cp := compileClusterScenario(t, s, node)
		failed := false
		for _, c := range []struct {
			peer string
			port uint16
		}{{"10.2.2.255", 1}, {"10.2.0.1", 1000}, {"10.2.0.1", 1002}, {"10.2.0.1", 1003}, {"10.0.0.253", 1000}, {"10.0.0.253", 1}} {
			p := packet{Dir: policybpf.Ingress, Pod: netip.MustParseAddr("10.0.0.3"), Peer: netip.MustParseAddr(c.peer), Proto: policybpf.ProtocolSCTP, Port: c.port}
			want, got := s.clusterOracle(node, false, p), evalClusterEntries(np, cp, false, p)
			if !want.agrees(got) {
				failed = true
				t.Errorf("10.0.0.253/32 %s SCTP, 10.2.0.0/16 %s SCTP 1000-1002: %s: oracle %s, compiled entries %s", actions[0], actions[1], p, want, resultText(got))
			}
		}
		if failed {
			t.Logf("cluster entries:\n%s", strings.Join(clusterEntryLines(cp), "\n"))
		}
	}
}
