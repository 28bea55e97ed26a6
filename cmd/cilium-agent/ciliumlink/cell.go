package ciliumlink

import (
	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq"
)

// Cell is enimasq inside Cilium's agent: enimasq.Features plus the glue that
// feeds them from Cilium. Add it to hive.New(cmd.Agent, ciliumlink.Cell).
var Cell = cell.Module(
	"enimasq",
	"enimasq ip-masq-agent maps and ENI pod rules",

	cell.Provide(
		newNodeConfig,
		newK8sClient,
	),
	// One writer of cilium_ipmasq_v4/v6 (ipmasq.go).
	cell.DecorateAll(disableCiliumIPMasqWriter),
	cell.DecorateAll(readOnlyIPMasqAgent),

	enimasq.Features,
	cell.Provide(newEnimasqMetrics),
	// ipam-allocations from Cilium's endpoints and router IP (podset.go).
	cell.Invoke(registerPodSet),
)
