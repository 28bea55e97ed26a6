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

// policyRow is a sliceRow that tells a change of its pods alone.
type policyRow[T any] interface {
	sliceRow
	SamePolicy(T) bool
	PodEntries() []endpoints.PodEndpoint
	// NameRules and WithNameIPs: the object's rules whose peers are
	// domain names, and the object with them given addresses (names.go).
	NameRules() []endpoints.NameRule
	WithNameIPs(func(endpoints.NameRule) []netip.Addr) T
}

// changedPods follows the changes of one kind of policy object for a
// deriver: which pod IPs a batch of changes recompiles. A policy is the
// union of its slices (endpoints.Union), so a change of one slice
// recompiles the pods of every slice of its policy, before and after;
// but a change of its pods alone (a pod comes or goes: the common change)
// recompiles only the pods that come, go or change, as the others' entries
// stay what they are.
type changedPods[T policyRow[T]] struct {
	table   statedb.Table[T]
	parents statedb.Index[T, string]
	// last holds, per object key, the object when last seen: a change or
	// deletion also recompiles the pods it no longer lists, and its old
	// policy's.
	last map[string]T
}

func newChangedPods[T policyRow[T]](table statedb.Table[T], parents statedb.Index[T, string]) *changedPods[T] {
	return &changedPods[T]{table: table, parents: parents, last: map[string]T{}}
}

// podsChanged adds to affected the pods of new that old does not list
// alike, and those of old that new does not list.
func podsChanged(old, new []endpoints.PodEndpoint, affected map[netip.Addr]struct{}) {
	was := make(map[netip.Addr]endpoints.PodEndpoint, len(old))
	for _, p := range old {
		was[p.PodIP] = p
	}
	for _, p := range new {
		if o, ok := was[p.PodIP]; !ok || o != p {
			affected[p.PodIP] = struct{}{}
		}
		delete(was, p.PodIP)
	}
	for a := range was {
		affected[a] = struct{}{}
	}
}

// affected returns the pod IPs that the changes of batch list or listed,
// and those that the slices of their policies list in txn (the batch's
// snapshot). seen is called with the key of each changed object.
func (c *changedPods[T]) affected(txn statedb.ReadTxn, batch func(func(statedb.Change[T], statedb.Revision) bool), seen func(key string)) map[netip.Addr]struct{} {
	affected := map[netip.Addr]struct{}{}
	parents := map[string]struct{}{}
	for change := range batch {
		key, obj := change.Object.Key(), change.Object
		if seen != nil {
			seen(key)
		}
		old, had := c.last[key]
		if change.Deleted {
			delete(c.last, key)
		} else {
			c.last[key] = obj
		}
		if had && !change.Deleted && old.SamePolicy(obj) {
			podsChanged(old.PodEntries(), obj.PodEntries(), affected)
			continue
		}
		versions := []T{obj} // a deleted object's last version
		if had {
			versions = append(versions, old)
		}
		for _, o := range versions {
			for _, pod := range o.PodIPs() {
				affected[pod] = struct{}{}
			}
			if p := o.Parent(); p != "" {
				parents[p] = struct{}{}
			}
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
