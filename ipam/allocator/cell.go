package allocator

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipmasq"
)

// Cell is enimasq's own allocator: it hands out pod IPs from the pools of
// enis into ipam-allocations, checkpoints them in the state dir, serves the
// CNI API (*API, mounted by the agent) and, with the API server, reports
// them in the CiliumNode's status.ipam.used. It takes Settings and a
// Programmed (the wait of a CNI ADD, the datapath's).
var Cell = cell.Group(
	cell.Provide(
		newAllocator,
		NewAPI,
		scriptCommands,
		newIPAMMetrics,
		(*ipamMetrics).collectors,
	),
	cell.Invoke(
		// The allocator's jobs (checkpoint restore, pool sync) run even
		// when nothing else asks for it.
		func(*Allocator) {},
		registerUsedReporter,
	),
)

// Programmed waits until the rules of the pod with IP ip and the routes of
// its ENI are in the kernel, or returns why not (datapath.Programmed).
type Programmed interface {
	Wait(ctx context.Context, ip netip.Addr) error
}

type allocatorParams struct {
	cell.In

	Log        *slog.Logger
	DB         *statedb.DB
	Node       nodeconfig.Config
	Settings   Settings
	Allocs     statedb.RWTable[*allocations.Allocation]
	ENIs       statedb.Table[*ciliumnode.ENI]
	CIDRs      statedb.Table[*ipmasq.CIDR]
	Programmed Programmed
	Jobs       job.Group
	Metrics    *ipamMetrics
	Health     cell.Health
	Client     *k8sclient.Client `optional:"true"`
}

// newAllocator builds the allocator and adds its jobs: restoring the
// checkpoint (which initializes ipam-allocations) and keeping each
// allocation's ENI and state in step with the pool. Off, it is still built
// (the API answers "not ready") and writes nothing.
func newAllocator(p allocatorParams) *Allocator {
	a := &Allocator{
		log:            p.Log,
		db:             p.DB,
		allocs:         p.Allocs,
		enis:           p.ENIs,
		cidrs:          p.CIDRs,
		programmed:     p.Programmed,
		settings:       p.Settings,
		checkpoint:     filepath.Join(p.Node.StateDir, CheckpointFile),
		ciliumNodePath: p.Settings.CiliumNodeSource,
		retry:          p.Settings.CiliumNodeResync,
		metrics:        p.Metrics,
	}
	if p.Settings.Off != "" {
		return a
	}
	wtxn := p.DB.WriteTxn(p.Allocs)
	a.restoreDone = p.Allocs.RegisterInitializer(wtxn, "ipam-checkpoint")
	wtxn.Commit()
	a.checkpointHealth = p.Health.NewScope("checkpoint")
	if p.Client != nil && p.Client.IsEnabled() {
		a.ciliumNodePath = "the API server (ciliumnodes/" + p.Client.NodeName() + ")"
	}
	p.Jobs.Add(
		job.OneShot("restore-allocations", a.restore),
		job.OneShot("sync-allocations", a.syncPool),
	)
	return a
}

type usedReporterParams struct {
	cell.In

	Settings Settings
	Log      *slog.Logger
	DB       *statedb.DB
	Allocs   statedb.Table[*allocations.Allocation]
	Jobs     job.Group
	Client   *k8sclient.Client `optional:"true"`
}

// registerUsedReporter reports the allocations in the CiliumNode's status
// when the API server is enabled (with Cilium's IPAM the allocator is off:
// status.ipam.used is Cilium's).
func registerUsedReporter(p usedReporterParams) {
	if p.Settings.Off != "" || p.Client == nil || !p.Client.IsEnabled() {
		return
	}
	r := &usedReporter{
		client:   p.Client,
		log:      p.Log,
		db:       p.DB,
		allocs:   p.Allocs,
		resync:   p.Settings.CiliumNodeResync,
		retryMin: time.Second,
		retryMax: 30 * time.Second,
	}
	p.Jobs.Add(job.OneShot("report-ipam-used", r.run))
}
