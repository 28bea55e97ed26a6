package datapath

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/tablesync"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
)

// desiredJob keeps eni-rules and eni-routes equal to ComputeDesired of the
// allocations, the ENIs and the non-masquerade CIDRs. Each round recomputes
// the whole desired state (cheap: thousands of rows) and writes only the
// rows that differ, so a change touches only what it changes: a new
// non-masquerade CIDR inserts one rule per pod and leaves every other row,
// and so the kernel, alone.
type desiredJob struct {
	desiredParams

	rulesInit, routesInit func(statedb.WriteTxn)
}

func (d *desiredJob) run(ctx context.Context, health cell.Health) error {
	for {
		rtxn := d.DB.ReadTxn()

		// Nothing is written before every input is loaded: a restart does
		// not churn the kernel with rules computed from a partial state.
		if waitFor := d.uninitialized(rtxn); waitFor != nil {
			health.OK("waiting for the CiliumNode, the checkpoint and the ip-masq-agent CIDRs")
			select {
			case <-ctx.Done():
				return nil
			case <-waitFor:
				continue
			}
		}

		allocsIter, allocsWatch := d.Allocs.AllWatch(rtxn)
		enisIter, enisWatch := d.ENIs.AllWatch(rtxn)
		cidrsIter, cidrsWatch := d.CIDRs.AllWatch(rtxn)
		var nonMasq []netip.Prefix
		for c := range cidrsIter {
			nonMasq = append(nonMasq, c.Prefix)
		}
		desired := ComputeDesired(statedb.Collect(allocsIter), ciliumnode.NewPool(statedb.Collect(enisIter)), nonMasq, d.Settings)

		wtxn := d.DB.WriteTxn(d.Rules, d.Routes)
		nRules := DiffRules(wtxn, d.Rules, desired.Rules)
		nRoutes := DiffRoutes(wtxn, d.Routes, desired.Routes)
		if d.rulesInit != nil {
			d.rulesInit(wtxn)
			d.routesInit(wtxn)
			d.rulesInit, d.routesInit = nil, nil
		}
		wtxn.Commit()
		d.Programmed.derivedFrom(d.Allocs.Revision(rtxn))
		if nRules+nRoutes > 0 {
			d.Log.Debug("Desired ip rules and routes changed", "rules-changed", nRules, "routes-changed", nRoutes,
				"rules", len(desired.Rules), "routes", len(desired.Routes))
		}
		health.OK(fmt.Sprintf("%d rules and %d routes desired", len(desired.Rules), len(desired.Routes)))

		select {
		case <-ctx.Done():
			return nil
		case <-allocsWatch:
		case <-enisWatch:
		case <-cidrsWatch:
		}
	}
}

// uninitialized returns a channel closed when the next uninitialized input
// is initialized, or nil when all are.
func (d *desiredJob) uninitialized(txn statedb.ReadTxn) <-chan struct{} {
	for _, init := range []func(statedb.ReadTxn) (bool, <-chan struct{}){
		d.ENIs.Initialized, d.Allocs.Initialized, d.CIDRs.Initialized,
	} {
		if ok, ch := init(txn); !ok {
			return ch
		}
	}
	return nil
}

// DiffRules makes table hold exactly the desired rules, touching only the
// rows that differ (compared without their status). New and changed rows
// are inserted Pending. It returns the number of rows written or deleted.
func DiffRules(wtxn statedb.WriteTxn, table statedb.RWTable[*Rule], desired []*Rule) int {
	return tablesync.Rows[*Rule, RuleKey]{
		Key:    func(r *Rule) RuleKey { return r.RuleKey },
		Query:  RuleKeyIndex.Query,
		Same:   (*Rule).sameDesired,
		Insert: func(r *Rule) *Rule { return r.Clone().SetStatus(reconciler.StatusPending()) },
	}.Sync(wtxn, table, desired)
}

// DiffRoutes is DiffRules for routes.
func DiffRoutes(wtxn statedb.WriteTxn, table statedb.RWTable[*Route], desired []*Route) int {
	return tablesync.Rows[*Route, RouteKey]{
		Key:    func(r *Route) RouteKey { return r.RouteKey },
		Query:  RouteKeyIndex.Query,
		Same:   (*Route).sameDesired,
		Insert: func(r *Route) *Route { return r.Clone().SetStatus(reconciler.StatusPending()) },
	}.Sync(wtxn, table, desired)
}
