package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/ipam/allocations"
)

// Programmed is the wait a CNI ADD needs: until a pod IP's rules, and the
// routes of the tables they look up, are in the kernel (Done in eni-rules
// and eni-routes). It reads the rows by index; it knows that they are the
// rows of the IP's current allocation from the revision of ipam-allocations
// the desired job last derived from.
type Programmed struct {
	db       *statedb.DB
	allocs   statedb.Table[*allocations.Allocation]
	rules    statedb.Table[*Rule]
	routes   statedb.Table[*Route]
	settings Settings

	mu      sync.Mutex
	derived statedb.Revision // of ipam-allocations
	next    chan struct{}    // closed at the next derive
}

func newProgrammed(db *statedb.DB, allocs statedb.Table[*allocations.Allocation], rules statedb.Table[*Rule],
	routes statedb.Table[*Route], s Settings,
) *Programmed {
	return &Programmed{db: db, allocs: allocs, rules: rules, routes: routes, settings: s, next: make(chan struct{})}
}

// derivedFrom records that eni-rules and eni-routes, as committed, hold the
// desired state of ipam-allocations at revision rev.
func (p *Programmed) derivedFrom(rev statedb.Revision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.derived = rev
	close(p.next)
	p.next = make(chan struct{})
}

func (p *Programmed) state() (statedb.Revision, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.derived, p.next
}

// Wait waits until the rules of the allocated IP ip and the routes of the
// tables they look up are Done, following the desired state as it changes
// (a config edit while waiting). A row in Error is retried by its
// reconciler (a route of a just attached ENI waits for its link): Wait goes
// on and returns the last such error when ctx ends (ctx's error if there
// was none). It returns at once when ip is not allocated or, derived, has
// no rules (not on a usable ENI of a family the node runs).
func (p *Programmed) Wait(ctx context.Context, ip netip.Addr) error {
	var lastErr error
	for {
		// The revision derived is read before the transaction, so the rows
		// the transaction sees are those of that revision or later.
		derived, derivedNext := p.state()
		txn := p.db.ReadTxn()
		_, rev, allocWatch, found := p.allocs.GetWatch(txn, allocations.AllocationIPIndex.Query(ip))
		if !found {
			return fmt.Errorf("%s is not allocated", ip)
		}
		var (
			done   bool
			err    error
			watch  <-chan struct{}
			routes <-chan struct{}
		)
		if rev <= derived {
			done, watch, routes, err = p.programmed(txn, ip)
			switch {
			case errors.Is(err, errNoRules):
				return err
			case err != nil:
				lastErr = err
			case done:
				return nil
			}
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return lastErr
			}
			return fmt.Errorf("%s: %w", ip, ctx.Err())
		case <-derivedNext:
		case <-allocWatch:
		case <-watch:
		case <-routes:
		}
	}
}

var errNoRules = errors.New("no rules")

// programmed says whether the rows of ip, as derived, are all Done; err is
// a row's error.
func (p *Programmed) programmed(txn statedb.ReadTxn, ip netip.Addr) (done bool, rulesWatch, routesWatch <-chan struct{}, err error) {
	rules, rulesWatch := p.rules.ListWatch(txn, RulePodIndex.Query(ip))
	routes, routesWatch := p.routes.AllWatch(txn)
	tables := map[int]bool{}
	done = true
	n := 0
	for r := range rules {
		n++
		if r.Table != MainTable {
			tables[r.Table] = true
		}
		switch r.Status.Kind {
		case reconciler.StatusKindDone:
		case reconciler.StatusKindError:
			return false, rulesWatch, routesWatch, fmt.Errorf("rule %q: %s", r.IPRule(), r.Status.GetError())
		default:
			done = false
		}
	}
	if n == 0 {
		return false, nil, nil, fmt.Errorf("%w: %s is not on a usable ENI of a family the node runs", errNoRules, ip)
	}
	if !p.settings.Routes {
		return done, rulesWatch, routesWatch, nil
	}
	for r := range routes {
		if !tables[r.Table] {
			continue
		}
		switch r.Status.Kind {
		case reconciler.StatusKindDone:
		case reconciler.StatusKindError:
			return false, rulesWatch, routesWatch, fmt.Errorf("route %s in table %d: %s", routeDst(r.Dst), r.Table, r.Status.GetError())
		default:
			done = false
		}
	}
	return done, rulesWatch, routesWatch, nil
}
