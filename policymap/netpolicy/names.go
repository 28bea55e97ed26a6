package netpolicy

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/compile"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
	"github.com/enimasq/enimasq/policymap/netpolicy/enforce"
)

// objectNames names the object that decided a verdict, from the tables:
// the program knows a ClusterPolicyEndpoint by its id (compile.ClusterObjectID);
// a NetworkPolicy decision is the union of PolicyEndpoints (those that
// list the pod and the other slices of their policies), so an allow names
// those whose rules allow the packet and a denial those that isolate the
// pod in the direction.
func objectNames(db *statedb.DB, pes statedb.Table[*endpoints.PolicyEndpoint], cpes statedb.Table[*endpoints.ClusterPolicyEndpoint]) enforce.ObjectNames {
	return func(d policybpf.Direction, q enforce.VerdictQuery, res policybpf.PolicyResult) string {
		txn := db.ReadTxn()
		switch res.Step {
		case policybpf.StepAdmin, policybpf.StepBaseline:
			if res.Object == 0 {
				if res.Allow {
					return "node IP"
				}
				return ""
			}
			for c := range cpes.All(txn) {
				if compile.ClusterObjectID(c.Name) == res.Object {
					return "ClusterPolicyEndpoint/" + c.Name
				}
			}
		case policybpf.StepNamespace:
			pod, peer := q.Pod.Unmap(), q.Peer.Unmap()
			var names []string
			listing := statedb.Collect(pes.List(txn, endpoints.PolicyEndpointPodIndex.Query(pod)))
			union := endpoints.Union(listing, func(parent string) []*endpoints.PolicyEndpoint {
				return statedb.Collect(pes.List(txn, endpoints.PolicyEndpointParentIndex.Query(parent)))
			})
			for _, pe := range union {
				if !pe.Isolates(d) {
					continue
				}
				if res.Allow {
					if e, ok := pe.PodEntry(pod); ok && e.HostIP == peer {
						return "node IP"
					}
					if !slices.ContainsFunc(pe.Rules(d), func(r endpoints.Rule) bool { return ruleAllows(r, peer, q.Protocol, q.Port) }) {
						continue
					}
				}
				names = append(names, "PolicyEndpoint/"+pe.Key())
			}
			slices.Sort(names)
			return strings.Join(names, ",")
		}
		return ""
	}
}

// ruleAllows says whether a PolicyEndpoint rule allows a peer and port.
func ruleAllows(r endpoints.Rule, peer netip.Addr, proto uint32, port uint16) bool {
	if !r.CIDR.Contains(peer) || slices.ContainsFunc(r.Except, func(e netip.Prefix) bool { return e.Contains(peer) }) {
		return false
	}
	if len(r.Ports) == 0 {
		return true
	}
	for _, p := range r.Ports {
		e := policybpf.PortEntry{Protocol: p.Protocol, StartPort: uint32(p.Port), EndPort: uint32(p.EndPort)}
		if e.Allows(proto, port, policybpf.PortKnown(proto)) {
			return true
		}
	}
	return false
}
