package datapath

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/cells/kernel"
)

// ruleRepair puts a rule or route of ours back as soon as someone else
// deletes it, instead of at the next refresh: it follows the kernel-rules,
// kernel-routes and kernel-links tables (cells/kernel: the kernel of the
// agent's network namespace, or a fake's (ipam/netlinkfake) in tests) and,
// after a rule leaves kernel-rules, marks Pending every Done row of
// eni-rules whose rule the kernel no longer holds exactly; after a route or
// link changes, every Done row of eni-routes whose route is not held as
// written. The reconciler adds them again. A link that goes away takes its
// routes with it: its rows go Pending, so the reconciler tries them and
// says why they fail (no link with the MAC) until a link with the ENI's MAC
// appears, which makes them Pending again at once. A row says Done only
// while the kernel holds it. The periodic refresh stays as the safety net.
//
// A rule added or deleted by anyone also prunes at once (pruneNow: the
// reconciler's Prune, at most every minPruneGap): a rule of ours that no row
// desires goes as it appears (an embedding agent's restore, a CNI ADD with
// the CIDRs of an older config, a rule added by hand), and the rules an
// endpoint's deletion leaves behind go as its ingress rule goes.
type ruleRepair struct {
	log      *slog.Logger
	db       *statedb.DB
	rules    statedb.RWTable[*Rule]
	routes   statedb.RWTable[*Route] // nil: routes are not ours (Cilium's IPAM)
	families []int
	settings Settings
	kernel   kernelTables
	// pruneNow triggers the rule reconciler's prune.
	pruneNow func()

	// deleted are the keys of the rules of ours the kernel lost, until it
	// holds them again or no row desires them: a row the reconciler marks
	// Done just after its rule was deleted (its add raced the deletion)
	// is caught as it turns Done (recheck).
	deleted map[RuleKey]struct{}

	// The changes of the kernel tables, from the start on.
	kernelRules  statedb.ChangeIterator[*kernel.Rule]
	kernelRoutes statedb.ChangeIterator[*kernel.Route]
	kernelLinks  statedb.ChangeIterator[*kernel.Link]
}

// kernelTables are the tables of cells/kernel the repair reads.
type kernelTables struct {
	cell.In

	Rules  statedb.Table[*kernel.Rule]
	Routes statedb.Table[*kernel.Route]
	Links  statedb.Table[*kernel.Link]
}

// follow starts the change iterators: every change from now on is seen.
func (r *ruleRepair) follow() error {
	wtxn := r.db.WriteTxn(r.kernel.Rules, r.kernel.Routes, r.kernel.Links)
	defer wtxn.Abort()
	var err error
	if r.kernelRules, err = r.kernel.Rules.Changes(wtxn); err != nil {
		return fmt.Errorf("follow kernel-rules: %w", err)
	}
	if r.kernelRoutes, err = r.kernel.Routes.Changes(wtxn); err != nil {
		return fmt.Errorf("follow kernel-routes: %w", err)
	}
	if r.kernelLinks, err = r.kernel.Links.Changes(wtxn); err != nil {
		return fmt.Errorf("follow kernel-links: %w", err)
	}
	wtxn.Commit()
	return nil
}

// kernelChanges is what changed in the kernel tables since the last look.
type kernelChanges struct {
	ruleDeleted, ruleChanged, routesChanged bool
	watch                                   []<-chan struct{}
}

func (r *ruleRepair) changes(txn statedb.ReadTxn) kernelChanges {
	var c kernelChanges
	rules, rw := r.kernelRules.Next(txn)
	for change := range rules {
		c.ruleChanged = true
		if change.Deleted {
			c.ruleDeleted = true
			if k, ok := r.ours(change.Object); ok {
				r.deleted[k] = struct{}{}
			}
		}
	}
	routes, routesW := r.kernelRoutes.Next(txn)
	for range routes {
		// A route added may be one of ours replaced in place.
		c.routesChanged = true
	}
	links, linksW := r.kernelLinks.Next(txn)
	for range links {
		c.routesChanged = true
	}
	c.watch = []<-chan struct{}{rw, routesW, linksW}
	return c
}

// run follows the kernel tables until ctx ends.
func (r *ruleRepair) run(ctx context.Context, health cell.Health) error {
	// The kernel's first listing is the state the reconcilers start from,
	// not a change: it is taken in without a repair.
	r.deleted = map[RuleKey]struct{}{}
	for {
		txn := r.db.ReadTxn()
		rulesInit, rw := r.kernel.Rules.Initialized(txn)
		routesInit, routesW := r.kernel.Routes.Initialized(txn)
		linksInit, linksW := r.kernel.Links.Initialized(txn)
		if rulesInit && routesInit && linksInit {
			r.changes(txn)
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-rw:
		case <-routesW:
		case <-linksW:
		}
	}

	clear(r.deleted)
	health.OK("Watching rule, route and link changes")
	var pruneGap <-chan time.Time // set while the last prune is too recent
	prunePending := false
	for {
		c := r.changes(r.db.ReadTxn())
		if c.ruleChanged {
			prunePending = true
		}
		var rulesWatch <-chan struct{} // while deleted rules are not back
		if c.ruleDeleted || len(r.deleted) > 0 {
			n, watch := r.repair(!c.ruleDeleted)
			if n > 0 {
				r.log.Info("Rules deleted by someone else: putting them back", "rules", n)
			}
			rulesWatch = watch
		}
		if c.routesChanged {
			r.repairRoutes()
		}
		if prunePending && pruneGap == nil && r.pruneNow != nil {
			prunePending = false
			r.pruneNow()
			pruneGap = time.After(minPruneGap)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-pruneGap:
			pruneGap = nil
		case <-c.watch[0]:
		case <-c.watch[1]:
		case <-c.watch[2]:
		case <-rulesWatch:
		}
	}
}

// minPruneGap bounds the prunes that rule changes trigger: a burst of
// changes (the reconciler's own adds among them) costs one rule listing per
// gap.
const minPruneGap = 50 * time.Millisecond

// repairRoutes marks Pending the rows whose route the kernel does not hold
// as desired (missing, or replaced in place: another gateway, link or scope)
// while their ENI's link is there, and tries again, at once, the rows that
// failed for want of a link that is back.
func (r *ruleRepair) repairRoutes() {
	if r.routes == nil {
		return
	}
	wtxn := r.db.WriteTxn(r.routes)
	defer wtxn.Abort()
	linkOfMAC := map[string]int{}
	for l := range r.kernel.Links.All(wtxn) {
		linkOfMAC[l.MAC] = l.Index
	}
	held := map[RouteKey][]netlink.Route{}
	for kr := range r.kernel.Routes.All(wtxn) {
		if kr.Protocol != RTProto || !slices.Contains(r.families, kr.Family) {
			continue
		}
		k := routeKeyOf(&kr.Route)
		held[k] = append(held[k], kr.Route)
	}
	var changed []*Route
	for row := range r.routes.All(wtxn) {
		link, linked := linkOfMAC[row.MAC]
		var retry bool
		switch kind := row.Status.Kind; {
		case kind == reconciler.StatusKindDone:
			// Done, but the link went (taking the route), or the route
			// went or was replaced: the reconciler writes it again, and
			// says why it fails.
			retry = !linked || !slices.ContainsFunc(held[row.RouteKey], func(kr netlink.Route) bool { return row.heldAs(&kr, link) })
		case kind == reconciler.StatusKindError:
			// Failing for want of its link, which is back: now, not at the
			// end of the backoff. Other errors keep their backoff.
			retry = linked && strings.Contains(row.Status.GetError(), "no link with MAC "+row.MAC)
		}
		if retry {
			changed = append(changed, row.Clone().SetStatus(reconciler.StatusPending()))
		}
	}
	for _, row := range changed {
		r.routes.Insert(wtxn, row)
	}
	wtxn.Commit()
	if len(changed) > 0 {
		r.log.Info("ENI links or routes changed behind enimasq's back", "routes-updated", len(changed))
	}
}

// ours is the key of a rule the kernel holds if it is of the kind the
// rows write (plain, our protocol, a family of ours).
func (r *ruleRepair) ours(kr *kernel.Rule) (RuleKey, bool) {
	if !slices.Contains(r.families, kr.Family) || int(kr.Protocol) != r.settings.PodRules.Protocol {
		return RuleKey{}, false
	}
	return ruleKeyOf(&kr.Rule)
}

// repair marks Pending the Done rows whose rule the kernel does not hold
// (onlyDeleted: only those of the deleted keys, when eni-rules changed and
// the kernel's rules did not), and returns how many. It forgets the
// deleted keys the kernel holds again, or no row desires, or whose row it
// marked Pending (the reconciler writes it), and, while some are left
// (their rows not Done yet), returns a watch of eni-rules to look again
// when they change.
func (r *ruleRepair) repair(onlyDeleted bool) (int, <-chan struct{}) {
	wtxn := r.db.WriteTxn(r.rules)
	defer wtxn.Abort()
	present := map[RuleKey]bool{}
	for kr := range r.kernel.Rules.All(wtxn) {
		if k, ok := r.ours(kr); ok {
			present[k] = true
		}
	}
	var missing []*Rule
	for row := range r.rules.All(wtxn) {
		if _, deleted := r.deleted[row.RuleKey]; onlyDeleted && !deleted {
			continue
		}
		if row.Status.Kind != reconciler.StatusKindDone || present[row.RuleKey] {
			continue
		}
		missing = append(missing, row)
	}
	for k := range r.deleted {
		if _, _, desired := r.rules.Get(wtxn, RuleKeyIndex.Query(k)); present[k] || !desired {
			delete(r.deleted, k)
		}
	}
	for _, row := range missing {
		r.rules.Insert(wtxn, row.Clone().SetStatus(reconciler.StatusPending()))
		delete(r.deleted, row.RuleKey)
	}
	txn := wtxn.Commit()
	if len(r.deleted) == 0 {
		return len(missing), nil
	}
	_, watch := r.rules.AllWatch(txn)
	return len(missing), watch
}
