package enimasq

import (
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/cells/nodeips"
	"github.com/enimasq/enimasq/ipam"
	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/masqmap"
	"github.com/enimasq/enimasq/policymap/netpolicy"
	"github.com/enimasq/enimasq/policymap/netpolicy/enforce"
)

// Features are enimasq's feature cells: the group an embedding agent links.
// Each depends only on statedb, jobs, health and nodeconfig.Config (and,
// optionally, a *k8sclient.Client), so an agent that has those links them as
// is, providing nodeconfig.Config from its own configuration.
var Features = cell.Group(
	kernel.Cell,
	nodeips.Cell,
	ipmasq.Cell,
	policymap.Module(masqmap.Cell, netpolicy.Cell),
	ipam.Cell,
)

// Agent is the standalone enimasq agent: the infrastructure (with the
// node-wide flags), the feature cells, the flags that an embedding agent
// declares itself (Cilium's --policy-audit-mode), and the feature APIs
// mounted on the agent API socket.
var Agent = cell.Group(
	infra.Infrastructure,
	Features,
	netpolicy.AuditCell,
	netpolicy.FQDNCell,
	cell.Provide(mountIPAMAPI, mountPolicyAPI),
)

// apiHandlersOut adds several handlers to the agent API.
type apiHandlersOut struct {
	cell.Out
	Handlers []infra.APIHandler `group:"api-handlers,flatten"`
}

// mountIPAMAPI serves the ENI IPAM API (/v1/ipam) on the agent socket. The
// ipam cell only provides the handler: where it is served is the agent's
// choice, so that an embedding agent can mount it on its own API.
func mountIPAMAPI(api *allocator.API) apiHandlersOut {
	var out apiHandlersOut
	for _, pattern := range allocator.APIPatterns {
		out.Handlers = append(out.Handlers, infra.APIHandler{Pattern: pattern, Handler: api})
	}
	return out
}

// mountPolicyAPI serves the wait for the policy programs on a pod's device
// (/v1/policy), which enimasq-cni's ADD asks, on the agent socket.
func mountPolicyAPI(api *enforce.API) apiHandlersOut {
	var out apiHandlersOut
	for _, pattern := range enforce.APIPatterns {
		out.Handlers = append(out.Handlers, infra.APIHandler{Pattern: pattern, Handler: api})
	}
	return out
}

// New builds a hive of the given cells with infra.HiveOptions.
func New(cells ...cell.Cell) *hive.Hive { return infra.New(cells...) }
