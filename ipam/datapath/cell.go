package datapath

import (
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/enimasq/enimasq/cells/metrics"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipmasq"
)

// Cell provides the eni-rules and eni-routes tables, derives them from
// enis, ipam-allocations and ip-masq-agent-cidrs, and reconciles them into
// the kernel with netlink (the agent's network namespace, or a
// NetlinkTarget's), repairing from the kernel tables (cells/kernel). It provides
// *Programmed, the wait a CNI ADD needs, and takes Settings.
var Cell = cell.Group(
	cell.ProvidePrivate(
		NewRuleTable,
		NewRouteTable,
		newNetlink,
	),
	cell.Provide(
		statedb.RWTable[*Rule].ToTable,
		statedb.RWTable[*Route].ToTable,
		newProgrammed,
		scriptCommands,
		tableMetrics,
	),
	cell.Invoke(
		registerDesired,
		registerReconcilers,
	),
)

type desiredParams struct {
	cell.In

	Log        *slog.Logger
	DB         *statedb.DB
	Settings   Settings
	Allocs     statedb.Table[*allocations.Allocation]
	ENIs       statedb.Table[*ciliumnode.ENI]
	CIDRs      statedb.Table[*ipmasq.CIDR]
	Rules      statedb.RWTable[*Rule]
	Routes     statedb.RWTable[*Route]
	Jobs       job.Group
	Programmed *Programmed
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

	Settings  Settings
	Log       *slog.Logger
	DB        *statedb.DB
	Jobs      job.Group
	Lifecycle cell.Lifecycle
	Reconcile reconciler.Params
	Rules     statedb.RWTable[*Rule]
	Routes    statedb.RWTable[*Route]
	Netlink   *nlHandle
	Kernel    kernelTables
}

func reconcilerOptions(s Settings, name string) []reconciler.Option {
	return []reconciler.Option{
		reconciler.WithName(name),
		reconciler.WithRetry(s.RetryMin, s.RetryMax),
		// Pruning runs once the tables are initialized, i.e. once the
		// CiliumNode, the allocations and the ip-masq-agent CIDRs are all
		// loaded: a restart never deletes the rules of running pods.
		reconciler.WithPruning(s.RefreshPeriod),
		reconciler.WithRefreshing(s.RefreshPeriod, rate.NewLimiter(rate.Limit(10000), 1000)),
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
		&ruleOps{nl: p.Netlink, settings: p.Settings, rules: p.Rules}, nil,
		reconcilerOptions(p.Settings, "eni-rules")...,
	)
	if err != nil {
		return err
	}
	if p.Netlink.repair {
		repair := &ruleRepair{log: p.Log, db: p.DB, rules: p.Rules, families: p.Netlink.families, settings: p.Settings,
			kernel: p.Kernel, pruneNow: rules.Prune}
		if p.Settings.Routes {
			repair.routes = p.Routes
		}
		// From now on: once the agent has started, no deletion goes
		// unseen.
		if err := repair.follow(); err != nil {
			return err
		}
		p.Jobs.Add(job.OneShot("repair-deleted-rules", repair.run))
	}
	if !p.Settings.Routes {
		// No route reconciler: its pruning would look at the CNI's protocol.
		return nil
	}
	_, err = reconciler.Register(
		p.Reconcile, p.Routes,
		(*Route).Clone, (*Route).SetStatus, (*Route).GetStatus,
		&routeOps{nl: p.Netlink}, nil,
		reconcilerOptions(p.Settings, "eni-routes")...,
	)
	return err
}

// tableMetrics are the rows of eni-rules and eni-routes by status.
func tableMetrics(db *statedb.DB, rules statedb.Table[*Rule], routes statedb.Table[*Route]) metrics.Outs {
	return metrics.Outs{Collectors: []prometheus.Collector{
		metrics.TableRows(db, rules, func(r *Rule) (reconciler.Status, bool) { return r.Status, true }),
		metrics.TableRows(db, routes, func(r *Route) (reconciler.Status, bool) { return r.Status, true }),
	}}
}
