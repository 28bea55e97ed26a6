package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
)

// hostOf is the node IP a scenario gives a pod IP: one per pod and
// family, in every object that names the pod (a node has one address per
// family); v6Host false gives the IPv6 pod an IPv4 host IP (no node IP of
// its family).
func hostOf(pod netip.Addr, v6Host bool) string {
	if pod.Is6() {
		if v6Host {
			return "fd00::fe"
		}
		return "10.0.0.254"
	}
	if pod.As4()[3]%2 == 0 {
		return "10.0.0.253"
	}
	return "10.0.0.254"
}

var clusterPriorities = []int{0, 1, 2, 10, 10, 10, 500, 1000}

// genPorts makes a rule's ports as genRule does: none (every protocol and
// port) a quarter of the time, else one to three specs of TCP, UDP, SCTP
// or no protocol (TCP), a port, a range or every port of the protocol.
func genPorts(rng *rand.Rand) []rawPort {
	if rng.IntN(4) == 0 {
		return nil
	}
	if rng.IntN(25) == 0 {
		// Many ports apart: a value of more intervals than fit a map
		// value, the rest in chunks.
		var out []rawPort
		for _, k := range rng.Perm(60)[:20+rng.IntN(40)] {
			out = append(out, rawPort{Protocol: []string{"TCP", "UDP"}[rng.IntN(2)], Port: 2000 + 3*k})
		}
		return out
	}
	var out []rawPort
	for range 1 + rng.IntN(3) {
		var p rawPort
		switch rng.IntN(4) {
		case 0:
			p.Protocol = "UDP"
		case 1:
			p.Protocol = "SCTP"
		case 2:
			p.Protocol = "TCP"
		}
		if rng.IntN(5) != 0 {
			p.Port = scenarioPorts[rng.IntN(len(scenarioPorts))]
			if rng.IntN(3) == 0 && p.Port < 65535 {
				p.EndPort = min(65535, p.Port+1+rng.IntN(10))
			}
		}
		out = append(out, p)
	}
	return out
}

// genClusterPrefix is genPrefix, with the node IPs and the pods' own
// addresses as /32s (/128s) now and then.
func genClusterPrefix(rng *rand.Rand, v6 bool) netip.Prefix {
	if rng.IntN(8) == 0 {
		var a netip.Addr
		switch r := rng.IntN(3); {
		case v6 && r == 0:
			a = netip.MustParseAddr("fd00::fe")
		case v6:
			a = poolPod(1+rng.IntN(poolSize), true)
		case r == 0:
			a = netip.MustParseAddr("10.0.0.254")
		case r == 1:
			a = netip.MustParseAddr("10.0.0.253")
		default:
			a = poolPod(1+rng.IntN(poolSize), false)
		}
		return netip.PrefixFrom(a, a.BitLen())
	}
	return genPrefix(rng, v6)
}

// genClusterScenario makes, half of the time, one to three PolicyEndpoints
// (genScenario), and
// zero to four ClusterPolicyEndpoints, some of them stand-ins, with one
// host IP per pod IP throughout.
func genClusterScenario(rng *rand.Rand, v6 bool) clusterScenario {
	var s clusterScenario
	if rng.IntN(2) == 0 {
		s.NP = genScenario(rng, v6)
	}
	v6Host := rng.IntN(8) != 0
	for n := range rng.IntN(5) {
		c := rawCPE{Name: fmt.Sprintf("cpe-%d", n), Tier: "Admin", Priority: clusterPriorities[rng.IntN(len(clusterPriorities))]}
		if rng.IntN(5) < 2 {
			c.Tier = "Baseline"
		}
		if n > 0 && rng.IntN(2) == 0 {
			// A slice of an earlier object's policy: its tier and
			// priority, its own pods and rules.
			first := s.CPEs[rng.IntN(n)]
			c.Policy, c.Tier, c.Priority = first.policy(), first.Tier, first.Priority
		}
		c.StandIn = rng.IntN(12) == 0
		for i := 1; i <= poolSize; i++ {
			if rng.IntN(3) != 0 {
				c.Pods = append(c.Pods, rawPod{PodIP: poolPod(i, false).String()})
			}
			if v6 && rng.IntN(2) == 0 {
				c.Pods = append(c.Pods, rawPod{PodIP: poolPod(i, true).String()})
			}
		}
		for _, dir := range []*[]rawClusterRule{&c.Ingress, &c.Egress} {
			for range rng.IntN(5) {
				r := rawClusterRule{CIDR: genClusterPrefix(rng, v6 && rng.IntN(2) == 0).String(), Ports: genPorts(rng),
					Action: []string{"Accept", "Deny", "Pass"}[rng.IntN(3)]}
				*dir = append(*dir, r)
			}
		}
		s.CPEs = append(s.CPEs, c)
	}
	s.fixHosts(v6Host)
	return s
}

// fixHosts gives every pod entry of every object its pod's one host IP.
func (s *clusterScenario) fixHosts(v6Host bool) {
	fix := func(pods []rawPod) {
		for i := range pods {
			pods[i].HostIP = hostOf(netip.MustParseAddr(pods[i].PodIP), v6Host)
		}
	}
	for i := range s.NP.PEs {
		fix(s.NP.PEs[i].Pods)
	}
	for i := range s.CPEs {
		fix(s.CPEs[i].Pods)
	}
}

// genClusterPackets aims packets at the boundaries of both kinds of
// objects (genPackets on the PolicyEndpoints and the cluster rules).
func genClusterPackets(rng *rand.Rand, s clusterScenario, v6 bool, n int) []packet {
	aim := s.NP.clone()
	for _, c := range s.CPEs {
		pe := rawPE{Name: "aim-" + c.Name}
		for _, r := range slices.Concat(c.Ingress, c.Egress) {
			pe.Egress = append(pe.Egress, rawRule{CIDR: r.CIDR, Ports: r.Ports})
		}
		aim.PEs = append(aim.PEs, pe)
	}
	return genPackets(rng, aim, v6, n)
}

// smaller returns the scenarios with one element less: a PolicyEndpoint's
// (scenario.smaller), or a ClusterPolicyEndpoint, one of its pods, rules
// or ports; or a priority lowered to 0, a stand-in made an object.
func (s clusterScenario) smaller() []clusterScenario {
	var out []clusterScenario
	for _, np := range s.NP.smaller() {
		c := s.clone()
		c.NP = np
		out = append(out, c)
	}
	edit := func(fn func(c *clusterScenario)) {
		c := s.clone()
		fn(&c)
		out = append(out, c)
	}
	for i, cpe := range s.CPEs {
		if cpe.Policy != "" {
			edit(func(c *clusterScenario) { c.CPEs[i].Policy = "" })
		}
		edit(func(c *clusterScenario) { c.CPEs = slices.Delete(c.CPEs, i, i+1) })
		for j := range cpe.Pods {
			edit(func(c *clusterScenario) { c.CPEs[i].Pods = slices.Delete(c.CPEs[i].Pods, j, j+1) })
		}
		if cpe.StandIn {
			edit(func(c *clusterScenario) { c.CPEs[i].StandIn = false })
		}
		for _, dir := range []func(c *clusterScenario) *[]rawClusterRule{
			func(c *clusterScenario) *[]rawClusterRule { return &c.CPEs[i].Ingress },
			func(c *clusterScenario) *[]rawClusterRule { return &c.CPEs[i].Egress },
		} {
			for j, r := range *dir(&s) {
				edit(func(c *clusterScenario) { rs := dir(c); *rs = slices.Delete(*rs, j, j+1) })
				for k := range r.Ports {
					edit(func(c *clusterScenario) { ps := &(*dir(c))[j].Ports; *ps = slices.Delete(*ps, k, k+1) })
				}
			}
		}
	}
	return out
}

// shrinkCluster removes elements from s while the packet still fails.
func shrinkCluster(s clusterScenario, fails func(clusterScenario) bool) clusterScenario {
	for progress := true; progress; {
		progress = false
		for _, c := range s.smaller() {
			if fails(c) {
				s, progress = c, true
				break
			}
		}
	}
	return s
}
