package compile

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// Edits from the templates: a change costs what changed, in the compiler
// too.
//
// The pods of a selection share its templates (template.go), and a change
// of a policy recompiles every pod it selects. Diffing each pod's rows
// against its new entries (versionDiff) reads all of them: for 10 pods with
// 2,000 peers each, 20,000 rows read to find 20 that change, per change.
// But a pod's rows of its newest version are exactly the entries of the
// templates they were last stamped from, which the deriver remembers
// (deriver.stamped); the difference between those templates and the new
// ones is the same for every pod of the selection, so it is computed once
// (diffTemplates) and each pod's edit is only its changed rows.
//
// It is taken only where an edit from the rows would be (canEdit) and the
// last edit is in the kernel (not Editing: no row of the version is
// Pending or refused, so the touched prefixes are the delta's alone), the
// delta is safe in place (edit.go) and encodes; otherwise the pod's rows
// are diffed as before.

// templateDelta is what changes from one compilation of a selection to
// the next: the entries added or with another value, the keys gone, and
// whether the difference is an edit that may be written in place.
type templateDelta struct {
	fresh []*templateEntry
	gone  []templateKey
	ok    bool
}

type templateKey struct {
	mapName string
	peer    netip.Prefix
}

// templatesKey identifies a list of templates while they are alive.
func templatesKey(ts []*policyTemplate) string {
	var b strings.Builder
	for _, t := range ts {
		fmt.Fprintf(&b, "%p,", t)
	}
	return b.String()
}

func templateRows(ts []*policyTemplate) int {
	n := 0
	for _, t := range ts {
		n += t.n
	}
	return n
}

// diffTemplates returns the difference from the entries of prev to those
// of next.
func diffTemplates(prev, next []*policyTemplate) *templateDelta {
	was := map[templateKey]*templateEntry{}
	for _, t := range prev {
		for _, b := range t.blocks {
			for i := range b {
				was[templateKey{b[i].mapName, b[i].peer}] = &b[i]
			}
		}
	}
	d := &templateDelta{ok: true}
	touched := map[string][]netip.Prefix{}
	for _, t := range next {
		for _, b := range t.blocks {
			for i := range b {
				e := &b[i]
				k := templateKey{e.mapName, e.peer}
				old, had := was[k]
				delete(was, k)
				if had && sameValue(old.value, e.value) {
					continue
				}
				if e.value.err != "" {
					d.ok = false // an entry that cannot be encoded: noted per pod
				}
				d.fresh = append(d.fresh, e)
				touched[k.mapName] = append(touched[k.mapName], k.peer)
			}
		}
	}
	for k := range was {
		d.gone = append(d.gone, k)
		touched[k.mapName] = append(touched[k.mapName], k.peer)
	}
	for _, ps := range touched {
		if nested(ps) {
			d.ok = false
		}
	}
	return d
}

// sameValue reports whether two compiled values ask for the same kernel
// state (sameDesired, for template entries).
func sameValue(a, b *portValue) bool {
	return a == b || a.err == b.err && string(a.bytes) == string(b.bytes) && a.text == b.text
}

// editByDelta writes a pod's change as an edit of its version in force
// from the difference of its templates (see above): prev are the templates
// its rows were stamped from, ts the new ones. False when it does not
// apply.
func (d *deriver[T, K]) editByDelta(before statedb.ReadTxn, pod netip.Addr, tv TierVersions, edit bool, prev, ts []*policyTemplate) (*podWrite[K], TierVersions, bool) {
	if !edit || tv.Editing || prev == nil || firstEntry(ts) == nil || d.bad[pod] != nil || tv.Rows != templateRows(prev) {
		return nil, tv, false
	}
	key := templatesKey(prev) + "|" + templatesKey(ts)
	delta := d.deltas[key]
	if delta == nil {
		delta = diffTemplates(prev, ts)
		d.deltas[key] = delta
	}
	if !delta.ok {
		return nil, tv, false
	}
	w := &podWrite[K]{pod: pod}
	for _, e := range delta.fresh {
		w.fresh = append(w.fresh, &MapEntry[K]{Pod: pod, Version: tv.Active, Status: reconciler.StatusPending(), t: e})
	}
	for _, g := range delta.gone {
		r, _, ok := d.entries.Get(before, entryQuery[K](PolicyEntryKey{Map: g.mapName, Pod: pod, Peer: g.peer, Version: tv.Active}))
		if !ok {
			return nil, tv, false // the rows are not the templates': diff them
		}
		w.stale = append(w.stale, r)
	}
	if len(w.fresh) == 0 && len(w.stale) > 0 {
		// Only deletions: a witness (edit.go), an entry the edit keeps.
		witness := firstEntry(ts)
		r, _, ok := d.entries.Get(before, entryQuery[K](PolicyEntryKey{Map: witness.mapName, Pod: pod, Peer: witness.peer, Version: tv.Active}))
		if !ok {
			return nil, tv, false
		}
		w.fresh = append(w.fresh, r.atVersion(tv.Active))
	}
	next := tv
	next.Rows = templateRows(ts)
	next.Editing = w.rows() > 0
	return w, next, true
}

// firstEntry is the first entry of the templates (they have one: a
// template of a selected pod has its root).
func firstEntry(ts []*policyTemplate) *templateEntry {
	for _, t := range ts {
		for _, b := range t.blocks {
			if len(b) > 0 {
				return &b[0]
			}
		}
	}
	return nil
}
