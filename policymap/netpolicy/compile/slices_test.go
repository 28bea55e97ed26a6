package compile

import (
	"net/netip"
	"testing"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// compileUnion is every pod's entries compiled from all the objects at once
// (CompilePod, the semantics): what the deriver must converge to.
func compileUnion(pes ...*endpoints.PolicyEndpoint) []*PolicyMapEntry {
	seen := map[netip.Addr]bool{}
	var out []*PolicyMapEntry
	for _, pe := range pes {
		for _, p := range pe.Pods {
			if !seen[p.PodIP] {
				seen[p.PodIP] = true
				out = append(out, CompilePod(p.PodIP, pes)...)
			}
		}
	}
	return out
}

// The deriver keeps every pod of a sliced policy equal to the union of
// the slices, through the changes that recompile only some pods: a slice
// whose pods alone change (a pod comes, goes, or moves to another node)
// recompiles those pods, and the others keep their rows, which are right
// as they are; a change of a slice's rules, or of its policy, recompiles
// every pod of the policies before and after.
func TestDeriverSlicedPolicy(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	host, other := a("10.255.0.1"), a("10.255.0.2")
	pod := func(ip string, h netip.Addr) endpoints.PodEndpoint {
		return endpoints.PodEndpoint{PodIP: a(ip), HostIP: h}
	}
	slice := func(name, policy string, pods []endpoints.PodEndpoint, egress ...string) *endpoints.PolicyEndpoint {
		pe := &endpoints.PolicyEndpoint{Namespace: "ns", Name: name, PolicyRef: "ns/" + policy, IsolatesEgress: true, Pods: pods}
		for _, c := range egress {
			pe.Egress = append(pe.Egress, endpoints.Rule{CIDR: p(c), Ports: []endpoints.Port{{Protocol: policybpf.ProtocolTCP, Port: 80}}})
		}
		return pe
	}
	f := startDeriver(t, nodeconfig.Config{EnableIPv4: true})
	sa := slice("a", "web", []endpoints.PodEndpoint{pod("10.0.0.1", host)}, "10.1.0.0/16")
	sb := slice("b", "web", []endpoints.PodEndpoint{pod("10.0.0.2", host)})
	sc := slice("c", "web", nil, "10.2.0.0/16")
	sd := slice("d", "db", []endpoints.PodEndpoint{pod("10.0.0.9", host)}, "10.9.0.0/16")
	f.write(false, sa, sb, sc, sd)
	f.waitFor(t, compileUnion(sa, sb, sc, sd))

	for _, step := range []struct {
		name   string
		change []*endpoints.PolicyEndpoint
	}{
		{"a pod comes to a slice", []*endpoints.PolicyEndpoint{slice("b", "web", []endpoints.PodEndpoint{pod("10.0.0.2", host), pod("10.0.0.3", host)})}},
		{"a pod goes", []*endpoints.PolicyEndpoint{slice("b", "web", []endpoints.PodEndpoint{pod("10.0.0.3", host)})}},
		{"a pod's node IP changes", []*endpoints.PolicyEndpoint{slice("a", "web", []endpoints.PodEndpoint{pod("10.0.0.1", other)}, "10.1.0.0/16")}},
		{"a rules-only slice's rules change", []*endpoints.PolicyEndpoint{slice("c", "web", nil, "10.3.0.0/16")}},
		{"a slice moves to another policy", []*endpoints.PolicyEndpoint{slice("c", "db", nil, "10.3.0.0/16")}},
		{"a pod moves between policies", []*endpoints.PolicyEndpoint{
			slice("b", "web", nil), slice("d", "db", []endpoints.PodEndpoint{pod("10.0.0.9", host), pod("10.0.0.3", host)}, "10.9.0.0/16")}},
	} {
		t.Run(step.name, func(t *testing.T) {
			f.write(false, step.change...)
			for _, c := range step.change {
				switch c.Name {
				case "a":
					sa = c
				case "b":
					sb = c
				case "c":
					sc = c
				case "d":
					sd = c
				}
			}
			f.waitFor(t, compileUnion(sa, sb, sc, sd))
		})
	}
}
