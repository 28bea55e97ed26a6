package compile

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf/policybpf"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// A round of the deriver (derive.go): the queued pods recompiled and their
// rows written, in one transaction of about a chunk.

// work recompiles queued pods in wtxn until about chunkEntries entries are
// compiled or rows written, or none is left; with onlyFresh, only the work
// of new changes. It returns the pods and rows written, and the mark of
// the transaction for the flow control (no rows: nothing to watch).
func (d *deriver[T, K]) work(ctx context.Context, wtxn statedb.WriteTxn, onlyFresh bool) (pods, written int, mark reconcileMark) {
	// The rows before this transaction, read from a snapshot: wtxn holds
	// the table's lock, so nothing else changes them, and this chunk
	// writes each pod once.
	var k K
	before := d.db.ReadTxn()
	d.unions.reset()
	clear(d.deltas) // keyed by the templates' addresses, alive this round
	chunk := d.flow.chunkRows()
	d.queue.next()
	entries := 0
	var last *MapEntry[K]
	for entries < chunk && written < chunk {
		pod, w, b, ok := d.queue.pop(onlyFresh)
		if !ok {
			break
		}
		if w != nil && !w.edit && len(w.fresh) > 0 {
			if tv, _ := tierOf(wtxn, d.versions, pod, k.tier()); tv.Want != w.fresh[0].Version {
				// A version written in parts, taken back for want of
				// room meanwhile (room.go): the rest is not written (its
				// rows would take the room it gave back); released, the
				// pod is compiled again.
				w.fresh, w.stamped = nil, nil
			}
		}
		if w == nil && d.cleanOnly[pod] {
			delete(d.cleanOnly, pod)
			tv, done := tierOf(wtxn, d.versions, pod, k.tier())
			d.pruneRestored(before, pod, tv, done)
			stale, next := cleanup(podRows(before, d.entries, pod), tv, done)
			if next != tv {
				setTier(wtxn, d.versions, pod, k.tier(), next)
			}
			w = &podWrite[K]{pod: pod, stale: stale}
		} else if w == nil {
			ts, names, named, ok := d.templatesOf(ctx, wtxn, pod)
			if !ok {
				continue // compiling in the background
			}
			pods++
			tv, done := tierOf(wtxn, d.versions, pod, k.tier())
			d.pruneRestored(before, pod, tv, done)
			quiet := othersQuiet(wtxn, d.versions, pod, k.tier())
			edit := canEdit(tv, done, quiet, named)
			prev := d.stamped[pod]
			delete(d.stamped, pod) // until the pod's rows are written whole
			var next TierVersions
			if w, next, ok = d.editByDelta(before, pod, tv, edit, prev, ts); ok {
				entries += w.rows()
			} else {
				desired := stampAll[K](ts, pod)
				entries += len(desired)
				d.noteBad(pod, desired)
				if w, next, ok = d.adopt(pod, tv, done, quiet && !named, desired); !ok {
					w, next, _ = diffPod(before, d.entries, pod, tv, done, edit, desired, d.alloc)
				}
			}
			if tv.Waiting && next.Want != tv.Want && next.Want != policybpf.PolicyVersionNone {
				// A new version waiting for room (room.go): written once
				// the switch releases the pod (it is queued again).
				continue
			}
			next.Names = max(next.Names, names)
			if next != tv {
				setTier(wtxn, d.versions, pod, k.tier(), next)
			}
			if !w.unstamped {
				w.stamped = ts
			}
			w.edit = w.edit || next.Editing
		}
		limit := chunk - written
		if w.rows() <= chunk || w.edit {
			limit = w.rows() // a pod's rows in one transaction, if they fit in a chunk; an edit always
		}
		n, ins := w.write(wtxn, d.entries, limit)
		written += n
		if ins != nil {
			last = ins
		}
		if w.rows() > 0 {
			d.queue.suspend(b, w)
			break
		}
		d.wrote(w)
	}
	if written == 0 || d.flow.off {
		return pods, written, mark
	}
	if last == nil {
		// Only deletions: a row to watch is the pod's next insertion, if
		// it is being written in parts, or a probe.
		if b := d.queue.front(); b != nil && b.partial != nil && len(b.partial.stale) == 0 {
			n, ins := b.partial.write(wtxn, d.entries, 1)
			written, last = written+n, ins
			if b.partial.rows() == 0 {
				d.wrote(d.queue.resume(b)) // written whole
			}
		} else if key, ok := d.probe(wtxn, before); ok {
			return pods, written, reconcileMark{key: key, rows: written}
		}
	}
	if last != nil {
		mark = reconcileMark{key: last.Key(), rows: written}
	}
	return pods, written, mark
}

// adopt takes over what the kernel holds of a pod's tier at the version an
// earlier run left in force (adopt.go), if it was read and the difference
// may be written in place (edit); false: the pod gets a new version.
func (d *deriver[T, K]) adopt(pod netip.Addr, tv TierVersions, done, edit bool, desired []*MapEntry[K]) (*podWrite[K], TierVersions, bool) {
	var k K
	if !restored(tv, done) || len(desired) == 0 {
		return nil, tv, false
	}
	kernel := d.state.takeAdoptable(k.tier(), pod)
	if kernel == nil {
		return nil, tv, false
	}
	rows, extra, ok := adopt(kernel, desired, tv.Active, edit)
	if !ok {
		d.adoption.renewed++
		return nil, tv, false
	}
	taken := adopted(rows) - extra
	d.adoption.pods++
	d.adoption.rows += taken
	d.adoption.written += len(desired) - taken
	d.adoption.extra += extra
	next := tv
	next.Want, next.Rows, next.Editing = tv.Active, len(rows), taken < len(desired)
	// In one transaction: the prune keeps the version's keys until the
	// run takes it over (Want), and then only those of its rows.
	w := &podWrite[K]{pod: pod, fresh: rows, edit: true}
	if extra > 0 {
		w.unstamped = true                 // its rows are not its templates'
		d.requeue = append(d.requeue, pod) // the extra keys go, next round
	}
	return w, next, true
}

// adoptionCounts are the restored pods' tiers the deriver took over
// (adopt.go), for the log line at initialization.
type adoptionCounts struct {
	pods, rows, written, extra, renewed int
}

// pruneRestored asks for a prune of the kind's maps when a pod's tier has
// left a version restored from an earlier run (replacedWithoutRows): no
// row deletion removes its keys. Without it they stay until the next
// periodic prune, if the first prune (at initialization) ran before the
// switch.
func (d *deriver[T, K]) pruneRestored(before statedb.ReadTxn, pod netip.Addr, tv TierVersions, done bool) {
	if d.prune != nil && replacedWithoutRows(podRows(before, d.entries, pod), tv, done) {
		d.prune.request()
	}
}

// wrote notes a pod's rows written whole: its newest version's rows are
// the entries of the templates they were stamped from (delta.go).
func (d *deriver[T, K]) wrote(w *podWrite[K]) {
	if w.stamped != nil {
		d.stamped[w.pod] = w.stamped
	}
}

// stampAll stamps a pod's entries from its templates.
func stampAll[K entryKind](ts []*policyTemplate, pod netip.Addr) []*MapEntry[K] {
	var out []*MapEntry[K]
	for _, t := range ts {
		out = stamp(t, out, pod)
	}
	return out
}

// templatesOf compiles a pod's entries into templates, and returns the
// revision of policy-fqdn they were compiled from and true if its objects
// have name rules; false while its selection compiles in the background
// (the pod waits for it).
func (d *deriver[T, K]) templatesOf(ctx context.Context, wtxn statedb.WriteTxn, pod netip.Addr) (_ []*policyTemplate, names statedb.Revision, named, ok bool) {
	var k K
	if !d.node.FamilyEnabled(pod) || pod.Is4In6() {
		return nil, 0, false, true
	}
	listing := statedb.Collect(d.endpoints.List(wtxn, k.podIndex().Query(pod)))
	sel, ok := selectionOf(pod, d.unions.of(wtxn, listing), listing, d.hostsOf(pod))
	if !ok {
		return nil, 0, false, true
	}
	sel, names = d.named(wtxn, pod, sel, listing)
	named = sel.named != nil
	key := sel.key()
	c, ok := d.templates[key]
	ts := c.templates
	if !ok {
		if bc := d.compiling[key]; bc != nil {
			bc.waiting[pod] = struct{}{}
			return nil, 0, false, false
		}
		if k.weight(sel) > backgroundWeight {
			d.compileInBackground(ctx, key, sel, pod)
			return nil, 0, false, false
		}
		ts = k.compile(sel)
		d.templates[key] = compiled[T]{sel: sel, templates: ts}
	}
	return ts, names, named, true
}

// hostsOf returns the function that finds pod's entry in an object.
func (d *deriver[T, K]) hostsOf(pod netip.Addr) func(T) (endpoints.PodEndpoint, bool) {
	return func(o T) (endpoints.PodEndpoint, bool) {
		pods := o.PodEntries()
		if len(pods) <= 8 {
			return o.PodEntry(pod)
		}
		h := d.hosts[o.Key()]
		if h == nil || h.obj != o {
			h = &podHosts[T]{obj: o, hosts: make(map[netip.Addr]endpoints.PodEndpoint, len(pods))}
			for _, p := range pods {
				h.hosts[p.PodIP] = p
			}
			d.hosts[o.Key()] = h
		}
		e, ok := h.hosts[pod]
		return e, ok
	}
}

// compileInBackground compiles a selection in a goroutine, one at a time;
// pod waits for it.
func (d *deriver[T, K]) compileInBackground(ctx context.Context, key string, sel selection[T], pod netip.Addr) {
	var k K
	d.compiling[key] = &backgroundCompile[T]{sel: sel, waiting: map[netip.Addr]struct{}{pod: {}}, start: time.Now()}
	d.log.Debug("Compiling a large selection in the background", "objects", sel.names(), "weight", k.weight(sel))
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		select {
		case d.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		ts := k.compile(sel)
		<-d.slots
		select {
		case d.results <- backgroundResult{key: key, templates: ts}:
		case <-ctx.Done():
		}
	}()
}

// names are the keys of the selection's objects.
func (s selection[T]) names() string {
	var out []string
	for _, o := range s.objs {
		out = append(out, o.Key())
	}
	return strings.Join(out, ",")
}
