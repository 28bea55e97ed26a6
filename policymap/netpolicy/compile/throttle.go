package compile

import (
	"iter"
	"net/netip"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// Flow control between the deriver and the reconciler of a map-entries
// table.
//
// The reconciler writes the rows to the kernel in revision order, so a row
// waits for every row committed before it. Were the deriver to write a
// large change in one go, a small change right after it would wait for all
// of it: 62,000 rows of a 50,000-rule PolicyEndpoint take 0.3-0.5 s to
// reconcile. So the deriver keeps at most a window of rows ahead of the
// reconciler: it remembers the last row of each transaction it commits (a
// mark) and, while the rows of the marks not yet reconciled are more than
// a chunk, it commits no more of the work it has started (the rest of a
// batch, a pod's rows past the first chunk). It waits on the mark's watch
// channel, and on policy-endpoints: a new change is worked at once, its
// first transaction past the window, and its rows are at most about two
// chunks behind the ones the reconciler is on.
//
// A mark is reconciled once its row is Done, or Error (a row the kernel
// refused, which the reconciler retries on its own: a full map or a fault
// never holds the deriver), or gone (deleted meanwhile: the watch fires,
// and the row is looked at again). A row written again meanwhile (by the
// deriver: Pending; marked for refresh: Refreshing) is at a later
// revision: the wait goes on for that one, which the reconciler reaches
// after the first. A transaction that only deletes leaves no row to
// watch: it probes the reconciler with a row marked Refreshing
// (deriver.probe).

// flowWindow is how many rows, in chunks, may be ahead of the reconciler
// before the deriver goes on with started work: one chunk being
// reconciled while the next is written keeps the reconciler busy.
const flowWindow = 1

// flowControl is the deriver's window on the reconciler.
type flowControl struct {
	// off: no reconciler is behind the table (deriver tests that mark
	// rows Done themselves, or not at all): never wait.
	off bool
	// chunk is the rows a transaction writes (chunkEntries unless set).
	chunk int

	marks []reconcileMark // oldest first
	ahead int             // the rows of the marks
}

// reconcileMark is the last row of a committed transaction and how many
// rows the transaction wrote.
type reconcileMark struct {
	key  PolicyEntryKey
	rows int
}

func (f *flowControl) chunkRows() int {
	if f.chunk > 0 {
		return f.chunk
	}
	return chunkEntries
}

// add records the mark of a committed transaction.
func (f *flowControl) add(m reconcileMark) {
	if f.off {
		return
	}
	f.marks = append(f.marks, m)
	f.ahead += m.rows
}

// flowOpen drops the marks of f that are reconciled in table and reports
// whether started work may go on: no more than flowWindow chunks of rows
// are ahead of the reconciler. When not, it returns the channel that
// closes when the oldest mark's row changes.
func flowOpen[K entryKind](f *flowControl, txn statedb.ReadTxn, table statedb.Table[*MapEntry[K]]) (bool, <-chan struct{}) {
	for len(f.marks) > 0 {
		m := f.marks[0]
		e, _, watch, ok := table.GetWatch(txn, entryQuery[K](m.key))
		if ok && e.Status.Kind != reconciler.StatusKindDone && e.Status.Kind != reconciler.StatusKindError {
			if f.ahead <= flowWindow*f.chunkRows() {
				return true, nil
			}
			return false, watch
		}
		f.marks[0] = reconcileMark{}
		f.marks = f.marks[1:]
		f.ahead -= m.rows
	}
	f.marks = nil // the slice does not shrink by itself
	return true, nil
}

// podWrite is the rows one pod's compilation changes: its stale rows to
// delete, then its new and changed rows to insert, Pending. A pod whose
// rows are more than a chunk is written over several transactions.
type podWrite[K entryKind] struct {
	pod   netip.Addr
	stale []*MapEntry[K]
	fresh []*MapEntry[K]
	// stamped are the templates the pod's newest rows are the entries
	// of, once written whole (delta.go); nil when not known.
	stamped []*policyTemplate
	// edit: an edit in place (or an adoption), written in one
	// transaction whatever its size, with the tier's Editing (the switch
	// knows it whole from the changes of its rows: pendingEdits).
	edit bool
	// unstamped: the rows are not the entries of the templates compiled
	// (an adoption's extra keys).
	unstamped bool
}

func (w *podWrite[K]) rows() int { return len(w.stale) + len(w.fresh) }

// diffPod compares a pod's desired entries with its rows in before, a
// snapshot that the current write transaction has not changed for the pod,
// and returns what to write (versionDiff: a changed pod gets a new
// version, written whole) and the pod's versions after it. The rows are
// read in the snapshot, not in the write transaction: iterating a table in
// a write transaction freezes its tree, so that every later insert copies
// each node on its path (for 50,000 pods, 170 MB of copied 256-way nodes).
func diffPod[K entryKind](before statedb.ReadTxn, table statedb.Table[*MapEntry[K]], pod netip.Addr, tv TierVersions, done, edit bool,
	desired []*MapEntry[K], alloc func() uint32) (*podWrite[K], TierVersions, bool) {
	fresh, stale, next, changed := versionDiff(podRows(before, table, pod), tv, done, edit, desired, alloc)
	return &podWrite[K]{pod: pod, stale: stale, fresh: fresh}, next, changed
}

// podRows are a pod's rows in txn.
func podRows[K entryKind](txn statedb.ReadTxn, table statedb.Table[*MapEntry[K]], pod netip.Addr) iter.Seq[*MapEntry[K]] {
	return func(yield func(*MapEntry[K]) bool) {
		for e := range table.Prefix(txn, podEntries[K](pod)) {
			if !yield(e) {
				return
			}
		}
	}
}

// write writes up to limit of the pod's rows in wtxn, deletions first (so
// that a map near full has room for the insertions). It returns how many
// it wrote and the last row inserted, nil if none.
func (w *podWrite[K]) write(wtxn statedb.WriteTxn, table statedb.RWTable[*MapEntry[K]], limit int) (n int, last *MapEntry[K]) {
	for ; n < limit && len(w.stale) > 0; n++ {
		table.Delete(wtxn, w.stale[0])
		w.stale[0] = nil
		w.stale = w.stale[1:]
	}
	for ; n < limit && len(w.fresh) > 0; n++ {
		last = w.fresh[0]
		table.Insert(wtxn, last)
		w.fresh[0] = nil
		w.fresh = w.fresh[1:]
	}
	return n, last
}

// probe marks a row Refreshing in wtxn and returns its key, for a
// transaction that only deletes: it leaves no row to watch, and the
// reconciler writes a refreshed row again (its kernel entry unchanged, as
// the periodic refresh does) in revision order, after the deletions. The
// row is the one the queued work deletes last, about: the last stale row
// of the pod being written in parts, or else the last row of the front
// batch's last pod (in before, the snapshot of the transaction's start).
// None (the rest of the work only inserts, where the next transaction
// leaves a row to watch), it returns false.
func (d *deriver[T, K]) probe(wtxn statedb.WriteTxn, before statedb.ReadTxn) (PolicyEntryKey, bool) {
	b := d.queue.front()
	if b == nil {
		return PolicyEntryKey{}, false
	}
	var row *MapEntry[K]
	if w := b.partial; w != nil {
		if len(w.stale) > 0 {
			row = w.stale[len(w.stale)-1]
		}
	} else if len(b.pods) > 0 {
		for e := range d.entries.Prefix(before, podEntries[K](b.pods[len(b.pods)-1])) {
			row = e
		}
	}
	if row == nil {
		return PolicyEntryKey{}, false
	}
	cur, _, ok := d.entries.Get(wtxn, entryQuery[K](row.Key()))
	if !ok {
		return PolicyEntryKey{}, false
	}
	// Only a row the kernel holds is refreshed; a Pending or refused one
	// is written again Pending (Refreshing would say the kernel holds it).
	status := reconciler.StatusRefreshing()
	if cur.Status.Kind != reconciler.StatusKindDone {
		status = reconciler.StatusPending()
	}
	d.entries.Insert(wtxn, cur.Clone().SetStatus(status))
	return row.Key(), true
}
