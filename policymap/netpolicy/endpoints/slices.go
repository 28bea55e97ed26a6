package endpoints

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// A policy is the union of its slices. The AWS network policy controller
// cuts one policy's pods, its ingress rules and its egress rules into
// objects independently (--endpoint-chunk-size, 200 by default): a slice
// may hold rules and no pods, or pods and some of the rules. As the AWS
// agent v1.5.0 does (derivePolicyEndpointsOfParentNP), a pod that any slice
// lists gets the rules of every slice of the same parent policy (Parent:
// spec.policyRef), each slice's with its own tier and priority. The
// compiler gathers a pod's objects with Union; the same function serves
// both kinds, and a third kind would implement Slice.

// Slice is a row of either kind as the union of slices needs it.
type Slice interface {
	comparable
	Key() string
	// Parent is the policy the object is a slice of; "" for an object
	// whose policy is not known (a stand-in whose policyRef cannot be
	// read), which is a policy of its own.
	Parent() string
	// PodEntry is the object's entry for a pod IP, if it lists it.
	PodEntry(netip.Addr) (PodEndpoint, bool)
}

// parentIndex indexes the objects of a kind by Parent; an object without
// one is not indexed.
func parentIndex[T Slice]() statedb.Index[T, string] {
	return statedb.Index[T, string]{
		Name: "parent",
		FromObject: func(o T) index.KeySet {
			if o.Parent() == "" {
				return index.NewKeySet()
			}
			return index.NewKeySet(index.String(o.Parent()))
		},
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     false,
	}
}

// Union returns the objects that decide for a pod, sorted by key: listing,
// the objects that list it (a query of the pod index), and every slice of
// their parents, which slicesOf returns (a query of the parent index).
func Union[T Slice](listing []T, slicesOf func(parent string) []T) []T {
	out := slices.Clone(listing)
	var parents []string
	for _, o := range listing {
		if p := o.Parent(); p != "" && !slices.Contains(parents, p) {
			parents = append(parents, p)
		}
	}
	for _, p := range parents {
		out = append(out, slicesOf(p)...)
	}
	// A table holds one object per key: sorted by key, an object listed
	// twice (it lists the pod and is a slice of a parent) is adjacent.
	slices.SortFunc(out, func(a, b T) int { return cmp.Compare(a.Key(), b.Key()) })
	return slices.Compact(out)
}

// UnionOf is Union over a list of objects of any pods (a pure compile, a
// test): those that list pod, and every object with the Parent of one.
func UnionOf[T Slice](pod netip.Addr, all []T) []T {
	var listing []T
	for _, o := range all {
		if _, ok := o.PodEntry(pod); ok {
			listing = append(listing, o)
		}
	}
	return Union(listing, func(parent string) []T {
		var out []T
		for _, o := range all {
			if o.Parent() == parent {
				out = append(out, o)
			}
		}
		return out
	})
}
