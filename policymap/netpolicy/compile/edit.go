package compile

import (
	"net/netip"
	"slices"

	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// Edits in place: a change costs what changed.
//
// A new version (versions.go) writes every entry of a pod's tier anew and
// deletes the old ones: for a pod with 2,000 peers whose policy lost one
// peer and gained another, 4,000 map operations where 2 would do. So when
// the compiler can show that every state on the way from the entries in
// force to the desired ones is within the two, the deriver edits the
// version in force in place: it deletes the entries that went, writes the
// ones that are new or changed, and leaves the rest alone.
//
// When is that safe? The program decides a packet by the pod's longest
// key that contains the peer (one LPM lookup per tier). Take the prefixes
// of the keys an edit touches (added, removed, or with another value) in
// one map. If no two of them nest, a peer has at most one of them on its
// chain of matching keys, so whatever subset of the edit the kernel holds
// at any moment, the peer is decided by that key as it was or as it will
// be, everything else on its chain being the same: the verdict is the old
// one or the new one, for every peer and port. Two touched prefixes that
// nest (an except moved from /24 to /25, a cidr and its except added
// together, an isolation that adds the root's deny and the rules under
// it) could mix: those changes go through a new version, switched in one
// step.
//
// The reconciler writes rows in revision order, so an earlier edit is in
// the kernel before a later one, but an entry it failed to write (Error,
// retried) or has not reached yet (Pending) can stay behind a later edit:
// the prefixes of such rows count as touched by the new edit too. The
// reconciler deletes a round's rows before it writes its others, and marks
// them Done after, so an edit's written rows Done say its deletions are
// in the kernel: an edit that only deletes writes one unchanged row again
// after them (a witness), so that the switch knows when it is whole. And a
// pod's tiers decide together (the Admin tier before the NetworkPolicy,
// the Baseline after): a tier is edited in place only while the pod's
// other tier is not being edited (othersQuiet), and a tier's new version
// comes into force only while the other tier has neither a version nor an
// edit being written (switchTiers), so that no packet meets one tier's
// new or half-edited state with the other's changing one.
//
// A tier is Editing while a row of its version in force is not in the
// kernel (switch.go), so policy-versions and health say while the kernel
// is not yet what the pod's policy says. A pod whose objects have name
// rules (names.go) is never edited in place: the DNS proxy releases an
// answer once the version compiled from it is in force, which an edit
// does not tell.

// canEdit says whether a pod's tier may be edited in place: the version in
// force (tv.Active, with rows in this run: Want is Active) is in the kernel
// (done), the pod's other tier is not being edited (quiet), and no name
// rule's addresses are compiled in (names).
func canEdit(tv TierVersions, done, quiet bool, names bool) bool {
	return done && quiet && !names && tv.Want == tv.Active && tv.Prev == policybpf.PolicyVersionNone &&
		tv.Active != policybpf.PolicyVersionNone && tv.Active != policybpf.PolicyVersionClosed && tv.Failed == ""
}

// editInPlace returns the rows that edit the version in force, at version
// v, from current (its rows, by key at version 0) to desired, and whether
// the edit is safe (see above); not safe, nothing.
func editInPlace[E versionedRow[E]](current map[PolicyEntryKey]E, desired []E, v uint32) (fresh, stale []E, ok bool) {
	touched := map[string][]netip.Prefix{}
	touch := func(k PolicyEntryKey) { touched[k.Map] = append(touched[k.Map], k.Peer) }
	seen := make(map[PolicyEntryKey]bool, len(desired))
	for _, d := range desired {
		k := d.Key()
		seen[k] = true
		r, had := current[k]
		switch {
		case !had || !r.sameDesired(d):
			fresh = append(fresh, d.atVersion(v))
			touch(k)
		case !inKernel(r.GetStatus()):
			touch(k) // an earlier edit's, not yet in the kernel
		}
	}
	for k, r := range current {
		if !seen[k] {
			stale = append(stale, r)
			touch(k)
		}
	}
	for _, ps := range touched {
		if nested(ps) {
			return nil, nil, false
		}
	}
	if len(fresh) == 0 && len(stale) > 0 {
		// Only deletions: an unchanged row written again (the same bytes)
		// after them tells when the kernel has them (witness): one the
		// reconciler has yet to write, if any, costs nothing more.
		witness := current[desired[0].Key()]
		for _, d := range desired {
			if r := current[d.Key()]; !inKernel(r.GetStatus()) {
				witness = r
				break
			}
		}
		fresh = append(fresh, witness.atVersion(v))
	}
	return fresh, stale, true
}

// inKernel says whether a row's status says the kernel holds it.
func inKernel(s reconciler.Status) bool {
	return s.Kind == reconciler.StatusKindDone || s.Kind == reconciler.StatusKindRefreshing
}

// nested reports whether two different prefixes of ps nest (one contains
// the other). Prefixes are nested or disjoint; sorted by address, longer
// after shorter at the same address, a prefix that contains another
// contains the one right after it, so neighbours tell.
func nested(ps []netip.Prefix) bool {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	for i := 1; i < len(ps); i++ {
		if ps[i] != ps[i-1] && ps[i-1].Bits() <= ps[i].Bits() && ps[i-1].Contains(ps[i].Addr()) {
			return true
		}
	}
	return false
}
