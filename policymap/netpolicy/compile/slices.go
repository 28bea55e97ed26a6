package compile

import (
	"net/netip"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// sliceRow is a row of either kind of policy object, as the derivers
// follow them.
type sliceRow interface {
	endpoints.Slice
	PodIPs() []netip.Addr
}

// changedPods follows the changes of one kind of policy object for a
// deriver: which pod IPs a batch of changes recompiles. A policy is the
// union of its slices (endpoints.Union), so a change of one slice
// recompiles the pods of every slice of its policy, before and after.
type changedPods[T sliceRow] struct {
	table   statedb.Table[T]
	parents statedb.Index[T, string]
	// podsOf and parentOf hold, per object key, the pod IPs it listed and
	// its policy when last seen: a change or deletion also recompiles the
	// pods it no longer lists, and its old policy's.
	podsOf   map[string][]netip.Addr
	parentOf map[string]string
}

func newChangedPods[T sliceRow](table statedb.Table[T], parents statedb.Index[T, string]) *changedPods[T] {
	return &changedPods[T]{table: table, parents: parents, podsOf: map[string][]netip.Addr{}, parentOf: map[string]string{}}
}

// affected returns the pod IPs that the changes of batch list or listed,
// and those that the slices of their policies list in txn (the batch's
// snapshot). seen is called with the key of each changed object.
func (c *changedPods[T]) affected(txn statedb.ReadTxn, batch func(func(statedb.Change[T], statedb.Revision) bool), seen func(key string)) map[netip.Addr]struct{} {
	affected := map[netip.Addr]struct{}{}
	parents := map[string]struct{}{}
	for change := range batch {
		key := change.Object.Key()
		if seen != nil {
			seen(key)
		}
		for _, pod := range c.podsOf[key] {
			affected[pod] = struct{}{}
		}
		if p := c.parentOf[key]; p != "" {
			parents[p] = struct{}{}
		}
		if change.Deleted {
			delete(c.podsOf, key)
			delete(c.parentOf, key)
			continue
		}
		pods := change.Object.PodIPs()
		for _, p := range pods {
			affected[p] = struct{}{}
		}
		c.podsOf[key] = pods
		if p := change.Object.Parent(); p != "" {
			c.parentOf[key] = p
			parents[p] = struct{}{}
		} else {
			delete(c.parentOf, key)
		}
	}
	for p := range parents {
		for o := range c.table.List(txn, c.parents.Query(p)) {
			for _, a := range o.PodIPs() {
				affected[a] = struct{}{}
			}
		}
	}
	return affected
}

// slicesCache lists the slices of a policy in one transaction, each once.
type slicesCache[T sliceRow] struct {
	table   statedb.Table[T]
	parents statedb.Index[T, string]
	cached  map[string][]T
}

func newSlicesCache[T sliceRow](table statedb.Table[T], parents statedb.Index[T, string]) *slicesCache[T] {
	return &slicesCache[T]{table: table, parents: parents, cached: map[string][]T{}}
}

// in returns the lister of slices for endpoints.Union in txn; the cache
// holds until reset.
func (s *slicesCache[T]) in(txn statedb.ReadTxn) func(parent string) []T {
	return func(parent string) []T {
		if out, ok := s.cached[parent]; ok {
			return out
		}
		out := statedb.Collect(s.table.List(txn, s.parents.Query(parent)))
		s.cached[parent] = out
		return out
	}
}

// reset empties the cache: a new transaction.
func (s *slicesCache[T]) reset() { clear(s.cached) }
