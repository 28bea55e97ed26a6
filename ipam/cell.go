package ipam

import (
	"log/slog"
	"path/filepath"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipmasq"
)

// Cell is the ENI IPAM: it provides the tables enis, ipam-allocations,
// eni-rules and eni-routes (as statedb.Table), the *Allocator and its *API,
// and reconciles the rules and routes into the kernel with netlink, in the
// agent's network namespace (or a NetlinkTarget's).
//
// It needs statedb, jobs, health, nodeconfig.Config, ipmasq.Config and the
// ip-masq-agent-cidrs table (ipmasq.Cell).
var Cell = cell.Module(
	"ipam",
	"ENI IPAM - pod IPs from the CiliumNode and their ip rules and routes",

	cell.Config(DefaultConfig),
	cell.ProvidePrivate(
		NewENITable,
		NewAllocationTable,
		NewRuleTable,
		NewRouteTable,
		NewSettings,
		newNetlink,
		newIPAMMetrics,
	),
	cell.Provide(
		statedb.RWTable[*ENI].ToTable,
		statedb.RWTable[*Allocation].ToTable,
		statedb.RWTable[*Rule].ToTable,
		statedb.RWTable[*Route].ToTable,
		newAllocator,
		(*Allocator).external,
		NewAPI,
		scriptCommands,
		(*ipamMetrics).collectors,
	),
	cell.Invoke(
		// The allocator's jobs (checkpoint restore, pool sync) run even
		// when nothing else asks for it.
		func(*Allocator) {},
		registerSource,
		registerUsedReporter,
		registerDesired,
		registerReconcilers,
		registerNodeIPs,
	),
)

type allocatorParams struct {
	cell.In

	Log      *slog.Logger
	DB       *statedb.DB
	Node     nodeconfig.Config
	Config   Config
	Settings Settings
	Allocs   statedb.RWTable[*Allocation]
	ENIs     statedb.Table[*ENI]
	CIDRs    statedb.Table[*ipmasq.CIDR]
	Rules    statedb.Table[*Rule]
	Routes   statedb.Table[*Route]
	Jobs     job.Group
	Metrics  *ipamMetrics
	Health   cell.Health
	Client   *k8sclient.Client `optional:"true"`
}

// newAllocator builds the allocator and adds its jobs: restoring the
// checkpoint (which initializes ipam-allocations) and keeping each
// allocation's ENI and state in step with the pool.
func newAllocator(p allocatorParams) *Allocator {
	wtxn := p.DB.WriteTxn(p.Allocs)
	initializer := "ipam-checkpoint"
	if !p.Settings.OwnsAllocations() {
		initializer = "embedding-agent-pod-set"
	}
	restoreDone := p.Allocs.RegisterInitializer(wtxn, initializer)
	wtxn.Commit()
	a := &Allocator{
		log:            p.Log,
		db:             p.DB,
		allocs:         p.Allocs,
		enis:           p.ENIs,
		cidrs:          p.CIDRs,
		rules:          p.Rules,
		routes:         p.Routes,
		settings:       p.Settings,
		checkpoint:     filepath.Join(p.Node.StateDir, CheckpointFile),
		ciliumNodePath: p.Config.CiliumNodePath,
		retry:          p.Config.CiliumNodeResync,
		restoreDone:    restoreDone,
		metrics:        p.Metrics,
	}
	if p.Settings.OwnsAllocations() && p.Settings.Off == "" {
		a.checkpointHealth = p.Health.NewScope("checkpoint")
	}
	if p.Client != nil && p.Client.IsEnabled() {
		a.ciliumNodePath = "the API server (ciliumnodes/" + p.Client.NodeName() + ")"
	}
	if p.Settings.Off != "" {
		wtxn := p.DB.WriteTxn(p.Allocs)
		restoreDone(wtxn)
		wtxn.Commit()
		return a
	}
	if !p.Settings.OwnsAllocations() {
		// The embedding agent's IPAM allocates: its pod-set source writes
		// the allocations (external.go).
		a.restoreDone = nil
		a.externalAllocs = &ExternalAllocations{db: p.DB, allocs: p.Allocs, enis: p.ENIs, initDone: restoreDone}
		return a
	}
	p.Jobs.Add(
		job.OneShot("restore-allocations", a.restore),
		job.OneShot("sync-allocations", a.syncPool),
	)
	return a
}

type sourceParams struct {
	cell.In

	Config   Config
	Settings Settings
	Log      *slog.Logger
	DB       *statedb.DB
	Table    statedb.RWTable[*ENI]
	Jobs     job.Group
	Health   cell.Health
	Metrics  *ipamMetrics
	// Client, when enabled, makes the API server's CiliumNode the source
	// instead of --ciliumnode-path.
	Client *k8sclient.Client `optional:"true"`
}

func registerSource(p sourceParams) error {
	if p.Settings.Off != "" {
		wtxn := p.DB.WriteTxn(p.Table)
		p.Table.RegisterInitializer(wtxn, "ciliumnode")(wtxn)
		wtxn.Commit()
		p.Health.OK("Disabled: " + p.Settings.Off)
		return nil
	}
	if err := checkCiliumNodeSource(p.Config, p.Client); err != nil {
		return err
	}
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, "ciliumnode")
	wtxn.Commit()
	if p.Client != nil && p.Client.IsEnabled() {
		p.Jobs.Add(job.OneShot("watch-ciliumnode", newK8sSource(p, initDone).run))
		return nil
	}
	p.Jobs.Add(job.OneShot("watch-ciliumnode", newSource(p.Config.CiliumNodePath, p, initDone).Run))
	return nil
}

type desiredParams struct {
	cell.In

	Log      *slog.Logger
	DB       *statedb.DB
	Settings Settings
	Allocs   statedb.Table[*Allocation]
	ENIs     statedb.Table[*ENI]
	CIDRs    statedb.Table[*ipmasq.CIDR]
	Rules    statedb.RWTable[*Rule]
	Routes   statedb.RWTable[*Route]
	Jobs     job.Group
}

func registerDesired(p desiredParams) {
	wtxn := p.DB.WriteTxn(p.Rules, p.Routes)
	rulesInit := p.Rules.RegisterInitializer(wtxn, "eni-desired")
	routesInit := p.Routes.RegisterInitializer(wtxn, "eni-desired")
	if p.Settings.Off != "" {
		rulesInit(wtxn)
		routesInit(wtxn)
		wtxn.Commit()
		return
	}
	wtxn.Commit()
	d := &desiredJob{desiredParams: p, rulesInit: rulesInit, routesInit: routesInit}
	p.Jobs.Add(job.OneShot("derive-eni-rules-routes", d.run))
}

type reconcilerParams struct {
	cell.In

	Config    Config
	Settings  Settings
	Allocs    statedb.Table[*Allocation]
	Log       *slog.Logger
	DB        *statedb.DB
	Jobs      job.Group
	Lifecycle cell.Lifecycle
	Reconcile reconciler.Params
	Rules     statedb.RWTable[*Rule]
	Routes    statedb.RWTable[*Route]
	Netlink   *nlHandle
}

func reconcilerOptions(cfg Config, name string) []reconciler.Option {
	return []reconciler.Option{
		reconciler.WithName(name),
		reconciler.WithRetry(cfg.ENINetlinkRetryMin, cfg.ENINetlinkRetryMax),
		// Pruning runs once the tables are initialized, i.e. once the
		// CiliumNode, the checkpoint and the ip-masq-agent CIDRs are all
		// loaded: a restart never deletes the rules of running pods.
		reconciler.WithPruning(cfg.ENINetlinkRefreshPeriod),
		reconciler.WithRefreshing(cfg.ENINetlinkRefreshPeriod, rate.NewLimiter(rate.Limit(10000), 1000)),
		reconciler.WithRoundLimits(10000, rate.NewLimiter(rate.Inf, 1)),
	}
}

func registerReconcilers(p reconcilerParams) error {
	if p.Settings.Off != "" {
		return nil
	}
	rules, err := reconciler.Register(
		p.Reconcile, p.Rules,
		(*Rule).Clone, (*Rule).SetStatus, (*Rule).GetStatus,
		&ruleOps{nl: p.Netlink, settings: p.Settings, allocs: p.Allocs}, nil,
		reconcilerOptions(p.Config, "eni-rules")...,
	)
	if err != nil {
		return err
	}
	if p.Netlink.changes != nil {
		repair := &ruleRepair{log: p.Log, db: p.DB, rules: p.Rules, nl: p.Netlink, settings: p.Settings,
			changes: p.Netlink.changes, pruneNow: rules.Prune, subscribed: make(chan struct{})}
		if p.Settings.OwnsAllocations() {
			repair.routes = p.Routes
		}
		p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error { repair.subscribe(); return nil }})
		p.Jobs.Add(job.OneShot("repair-deleted-rules", repair.run))
	}
	if !p.Settings.OwnsAllocations() {
		// With Cilium's IPAM the ENI tables' routes are Cilium's: no route
		// reconciler (its pruning would look at Cilium's protocol).
		return nil
	}
	_, err = reconciler.Register(
		p.Reconcile, p.Routes,
		(*Route).Clone, (*Route).SetStatus, (*Route).GetStatus,
		&routeOps{nl: p.Netlink}, nil,
		reconcilerOptions(p.Config, "eni-routes")...,
	)
	return err
}
