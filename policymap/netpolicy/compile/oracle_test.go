package compile

import (
	"flag"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// The property tests generate random PolicyEndpoint files (nested and
// overlapping CIDRs, excepts of both families, inside, outside and covering
// their cidr, port ranges, several objects per pod, dual-stack pods) and
// random packets, and compare the verdict of the compiled entries (and, in
// the privileged test, of the real program on the reconciled maps) with a
// direct evaluation of the NetworkPolicy semantics on the generated input.

var policySeed = flag.Uint64("policy-seed", 0, "seed of the policy property tests (0: random, printed)")

// propertySeed returns the seed to use and logs how to rerun with it.
func propertySeed(t testing.TB) uint64 {
	seed := *policySeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("policy property seed %d (rerun with -policy-seed=%d)", seed, seed)
	return seed
}

// Pod pool: pod i has 10.0.0.i and fd00::i; the node is 10.0.0.254 /
// fd00::fe (and, for some pods, 10.0.0.253).
const poolSize = 4

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// oracleAllows evaluates Kubernetes NetworkPolicy semantics directly on
// the raw input: a pod that no object selects, or that no selecting object
// isolates in the direction, allows everything; its node IP is always
// allowed; otherwise some rule must contain the peer, none of that rule's
// own excepts may, and the rule's ports must match. Pod IPs of a family the
// node does not run are not programmed: allowed.
func (s scenario) oracleAllows(node nodeconfig.Config, p packet) bool {
	if !node.FamilyEnabled(p.Pod) {
		return true
	}
	// A policy is the union of its slices: the objects that list the pod
	// and every other object of their policies decide; the node IP is
	// that of the objects that list it.
	listing := map[string]bool{}
	for _, pe := range s.PEs {
		for i := range pe.Pods {
			if netip.MustParseAddr(pe.Pods[i].PodIP) != p.Pod {
				continue
			}
			listing[pe.policy()] = true
			if h, err := netip.ParseAddr(pe.Pods[i].HostIP); err == nil && h == p.Peer {
				return true
			}
			break
		}
	}
	isolated := false
	for _, pe := range s.PEs {
		if !listing[pe.policy()] {
			continue
		}
		dir, rules := "Egress", pe.Egress
		if p.Dir == policybpf.Ingress {
			dir, rules = "Ingress", pe.Ingress
		}
		if !strings.Contains(strings.Join(pe.Isolation, ","), dir) {
			continue
		}
		isolated = true
		for _, r := range rules {
			if ruleAllows(r, p) {
				return true
			}
		}
	}
	return !isolated
}

func ruleAllows(r rawRule, p packet) bool {
	if !netip.MustParsePrefix(r.CIDR).Masked().Contains(p.Peer) {
		return false
	}
	for _, e := range r.Except {
		if netip.MustParsePrefix(e).Masked().Contains(p.Peer) {
			return false
		}
	}
	if len(r.Ports) == 0 {
		return true
	}
	for _, port := range r.Ports {
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

// evalEntries is the program's decision, in Go, on a set of entries: the
// pod's longest matching key in the map of the direction and family, then
// the first port entry that allows. No key: no policy, allowed.
func evalEntries(entries []*PolicyMapEntry, p packet) bool {
	name := policybpf.PolicyMapName(p.Dir, bpf.FamilyOf(p.Pod))
	var best *PolicyMapEntry
	for _, e := range entries {
		if e.Map() == name && e.Pod == p.Pod && e.Peer().Contains(p.Peer) && (best == nil || e.Peer().Bits() > best.Peer().Bits()) {
			best = e
		}
	}
	if best == nil {
		return true
	}
	chunks := map[string][]byte{}
	for _, c := range best.Spill() {
		chunks[string(c.Key)] = c.Value
	}
	v, err := policybpf.UnmarshalPolicyValue(best.MapValue(), func(k []byte) ([]byte, error) { return chunks[string(k)], nil })
	if err != nil {
		panic(err)
	}
	return policybpf.EvaluatePolicy(nil, &v, policybpf.PortPoint(p.Proto, p.Port, policybpf.PortKnown(p.Proto)), false).Allow
}

// compileScenario compiles every pod IP of the node's families.
func compileScenario(t testing.TB, s scenario, node nodeconfig.Config) []*PolicyMapEntry {
	pes := s.parse(t)
	var out []*PolicyMapEntry
	for _, pod := range s.podIPs() {
		if node.FamilyEnabled(pod) {
			out = append(out, CompilePod(pod, pes)...)
		}
	}
	return out
}

// TestCompileMatchesOracle: the compiled entries, evaluated as the program
// does, give the NetworkPolicy verdict for thousands of random packets on
// random policies, on an IPv4-only and on a dual-stack node.
func TestCompileMatchesOracle(t *testing.T) {
	seed := propertySeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	scenarios, packets := 1500, 40
	if testing.Short() {
		scenarios = 200
	}
	checked := 0
	for i := range scenarios {
		node := nodeconfig.Config{EnableIPv4: true, EnableIPv6: i%2 == 1}
		s := genScenario(rng, true)
		entries := compileScenario(t, s, node)
		for _, p := range genPackets(rng, s, true, packets) {
			checked++
			want := s.oracleAllows(node, p)
			if evalEntries(entries, p) == want {
				continue
			}
			min := shrink(s, func(c scenario) bool {
				return evalEntries(compileScenario(t, c, node), p) != c.oracleAllows(node, p)
			})
			t.Fatalf("seed %d, scenario %d, node %+v: packet %s: oracle allows=%t, compiled entries say %t\nminimal case:\n%s\nentries:\n%s",
				seed, i, node, p, want, !want, min.render(), strings.Join(entryLines(compileScenario(t, min, node)), "\n"))
		}
	}
	t.Logf("%d packets on %d random policies agree with the oracle", checked, scenarios)
}
