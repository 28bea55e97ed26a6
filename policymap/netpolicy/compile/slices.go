package compile

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"strings"

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

// objectSet is the objects that decide for a pod (endpoints.Union),
// sorted by key, and a key that identifies them while they are alive: the
// objects are immutable, so their addresses stand for their contents. The
// key is short whatever the number of objects (the addresses' SHA-256 past
// a few): every pod's selection key starts with it.
type objectSet[T any] struct {
	objs []T
	key  string
}

func newObjectSet[T any](objs []T) objectSet[T] {
	b := make([]byte, 0, 12*len(objs))
	for _, o := range objs {
		b = fmt.Appendf(b, "%p", any(o)) // T is a pointer type
	}
	if len(b) > sha256.Size {
		sum := sha256.Sum256(b)
		b = sum[:]
	}
	return objectSet[T]{objs: objs, key: string(b)}
}

// unions takes the union of slices (endpoints.Union) for the pods of one
// transaction: once per set of listing policies, not once per pod. A pod
// of a policy cut into 250 slices would otherwise gather, sort and key 250
// objects on its own.
type unions[T sliceRow] struct {
	table   statedb.Table[T]
	parents statedb.Index[T, string]
	slices  map[string][]T          // parent -> its slices
	sets    map[string]objectSet[T] // listing's policies -> their union
}

func newUnions[T sliceRow](table statedb.Table[T], parents statedb.Index[T, string]) *unions[T] {
	return &unions[T]{table: table, parents: parents, slices: map[string][]T{}, sets: map[string]objectSet[T]{}}
}

// of returns the union for a pod that the objects of listing list, in
// txn, the transaction since the last reset.
func (u *unions[T]) of(txn statedb.ReadTxn, listing []T) objectSet[T] {
	// Each part is its policy's name, length first, or the address of an
	// object that is a policy of its own: no two sets of parts read alike.
	var b strings.Builder
	for _, o := range listing {
		if p := o.Parent(); p != "" {
			fmt.Fprintf(&b, "p%d:%s", len(p), p)
		} else {
			fmt.Fprintf(&b, "o%p;", any(o))
		}
	}
	key := b.String()
	if set, ok := u.sets[key]; ok {
		return set
	}
	set := newObjectSet(endpoints.Union(listing, func(parent string) []T {
		out, ok := u.slices[parent]
		if !ok {
			out = statedb.Collect(u.table.List(txn, u.parents.Query(parent)))
			u.slices[parent] = out
		}
		return out
	}))
	u.sets[key] = set
	return set
}

// reset empties the caches: a new transaction.
func (u *unions[T]) reset() {
	clear(u.slices)
	clear(u.sets)
}
