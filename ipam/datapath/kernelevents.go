package datapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/enimasq/enimasq/cells/nldump"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
)

// ruleRepair puts a rule or route of ours back as soon as someone else
// deletes it, instead of at the next refresh: it listens to the change
// notifications (NetlinkChanges: the kernel's in the agent's network
// namespace, or a fake's (ipam/netlinkfake) in tests) and, after a deletion,
// marks Pending every Done row of eni-rules (eni-routes) whose rule (route)
// the kernel no longer holds exactly; the reconciler adds it again. A link
// that goes away takes its routes with it (the kernel sends no route
// notification for those): its rows go Pending, so the reconciler tries
// them and says why they fail (no link with the MAC) until a link with the
// ENI's MAC appears, which makes them Pending again at once. A row says Done
// only while the kernel holds it. The periodic refresh stays as the safety
// net (for a lost notification).
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
	nl       *nlHandle
	settings Settings
	changes  NetlinkChanges
	// pruneNow triggers the rule reconciler's prune.
	pruneNow func()

	// subscribed is closed by subscribe; then sub is set, or subErr.
	subscribed chan struct{}
	sub        NetlinkSubscription
	subErr     error
}

// subscribe subscribes to the notifications, from a start hook: once the
// agent has started, no deletion goes unseen.
func (r *ruleRepair) subscribe() {
	defer close(r.subscribed)
	r.sub, r.subErr = r.changes.SubscribeChanges(r.nl.families, r.routes != nil)
}

// run reads the notifications until ctx ends.
func (r *ruleRepair) run(ctx context.Context, health cell.Health) error {
	// The job may start before the start hook that subscribes has run.
	select {
	case <-ctx.Done():
		return nil
	case <-r.subscribed:
	}
	if r.sub == nil {
		// Not fatal: the refresh repairs, later.
		health.Degraded("no kernel notifications: deleted rules and routes come back at the refresh only", r.subErr)
		<-ctx.Done()
		return nil
	}
	sub := r.sub

	deleted := make(chan struct{}, 1)       // a rule went
	ruleChanged := make(chan struct{}, 1)   // a rule came or went
	routesChanged := make(chan struct{}, 1) // a route changed, a link came or went
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for ctx.Err() == nil {
			changes, err := sub.Receive(ctx)
			if err != nil {
				if ctx.Err() == nil {
					r.log.Warn("Rule notifications stopped; deleted rules come back at the refresh", "error", err)
				}
				return
			}
			for _, c := range changes {
				switch c {
				case RuleAdded:
					notify(ruleChanged)
				case RuleDeleted:
					notify(deleted)
					notify(ruleChanged)
				case RouteAdded, RouteDeleted, LinkChanged, LinkDeleted:
					// A route added may be one of ours replaced in place.
					notify(routesChanged)
				case ChangesLost:
					// Notifications were lost: check everything.
					notify(deleted)
					notify(ruleChanged)
					notify(routesChanged)
				}
			}
		}
	}()
	defer func() {
		<-readerDone
		sub.Close()
	}()

	health.OK("Watching rule, route and link changes")
	var pruneGap <-chan time.Time // set while the last prune is too recent
	prunePending := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ruleChanged:
			prunePending = true
		case <-pruneGap:
			pruneGap = nil
		case <-readerDone:
			err := errors.New("the notification socket failed")
			health.Degraded("no kernel notifications any more: deleted rules and routes come back at the refresh only", err)
			return err
		case <-deleted:
			if n, err := r.repair(); err != nil {
				health.Degraded("checking the rules after a deletion", err)
			} else {
				if n > 0 {
					r.log.Info("Rules deleted by someone else: putting them back", "rules", n)
				}
				health.OK("Watching rule, route and link changes")
			}
		case <-routesChanged:
			if err := r.repairRoutes(); err != nil {
				health.Degraded("checking the routes after a change", err)
			} else {
				health.OK("Watching rule, route and link changes")
			}
		}
		if prunePending && pruneGap == nil && r.pruneNow != nil {
			prunePending = false
			r.pruneNow()
			pruneGap = time.After(minPruneGap)
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
func (r *ruleRepair) repairRoutes() error {
	if r.routes == nil {
		return nil
	}
	links, err := nldump.List("ip link list", r.nl.LinkList)
	if err != nil {
		return fmt.Errorf("ip link list: %w", err)
	}
	linkOfMAC := map[string]int{}
	for _, l := range links {
		linkOfMAC[l.Attrs().HardwareAddr.String()] = l.Attrs().Index
	}
	kernel, err := ListRoutes(r.nl, r.nl.families)
	if err != nil {
		return err
	}
	held := map[RouteKey][]netlink.Route{}
	for _, kr := range kernel {
		k := routeKeyOf(&kr)
		held[k] = append(held[k], kr)
	}
	wtxn := r.db.WriteTxn(r.routes)
	defer wtxn.Abort()
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
	return nil
}

// notify signals ch without blocking: one pending signal covers a burst.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// repair marks Pending the Done rows whose rule the kernel does not hold, and
// returns how many.
func (r *ruleRepair) repair() (int, error) {
	present := map[RuleKey]bool{}
	for _, fam := range r.nl.families {
		rules, err := nldump.List("ip rule list", func() ([]netlink.Rule, error) { return r.nl.RuleList(fam) })
		if err != nil {
			return 0, fmt.Errorf("ip rule list: %w", err)
		}
		for i := range rules {
			k, plain := ruleKeyOf(&rules[i])
			if plain && int(rules[i].Protocol) == r.settings.PodRules.Protocol {
				present[k] = true
			}
		}
	}
	wtxn := r.db.WriteTxn(r.rules)
	defer wtxn.Abort()
	var missing []*Rule
	for row := range r.rules.All(wtxn) {
		if row.Status.Kind != reconciler.StatusKindDone || present[row.RuleKey] {
			continue
		}
		missing = append(missing, row)
	}
	for _, row := range missing {
		r.rules.Insert(wtxn, row.Clone().SetStatus(reconciler.StatusPending()))
	}
	wtxn.Commit()
	return len(missing), nil
}
