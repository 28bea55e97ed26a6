package allocations

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/metrics"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
)

// Cell provides the ipam-allocations table, written by one writer (enimasq's
// allocator, or the embedding agent's pod set), and its metric
// enimasq_ipam_ips.
var Cell = cell.Group(
	cell.ProvidePrivate(NewAllocationTable),
	cell.Provide(
		statedb.RWTable[*Allocation].ToTable,
		poolMetrics,
	),
)

func poolMetrics(db *statedb.DB, enis statedb.Table[*ciliumnode.ENI], allocs statedb.Table[*Allocation]) metrics.Outs {
	return metrics.Outs{Collectors: []prometheus.Collector{
		&poolIPs{db: db, enis: enis, allocs: allocs, desc: prometheus.NewDesc(metrics.Namespace+"_ipam_ips",
			"IPs of a usable ENI's pool by type: pool, used (allocated), available", []string{"eni", "type"}, nil)},
	}}
}
