package compile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

const (
	// chunkEntries is about how many entries the deriver compiles and
	// rows it writes in one transaction before it looks for newer
	// changes: a PolicyEndpoint with many pods, or a pod with many
	// entries, is written in chunks, and a change to another one, which
	// goes first, waits for one chunk at most. It is also the unit of the
	// flow control (throttle.go): the reconciler writes about 120,000-
	// 200,000 rows a second to the kernel on 2 cores, so a chunk is 10-17
	// ms of its work and a new change waits for about two. A pod's rows
	// are written in one transaction unless they are more than a chunk.
	chunkEntries = 2048
	// backgroundWeight is the compile work (rules and excepts of the
	// isolated directions, see selection.weight) above which a selection
	// is compiled off the derive loop, so that other changes go on while
	// it compiles. Below, compiling takes at most a few milliseconds.
	backgroundWeight = 2000
)

// policyDeriver keeps policy-map-entries equal to the compilation of
// policy-endpoints. On a change it recompiles only the pod IPs that the
// changed objects list (before and after the change) and writes only the
// entries whose bytes differ: an unchanged entry keeps its revision, so the
// reconciler does nothing for it.
//
// Pods whose selections (objects selecting them and node IPs) are equal
// share one compilation (policyTemplate), stamped per pod IP. The pod IPs
// of a change are queued as a batch; the newest batch is worked first, in
// chunks of about chunkEntries entries per transaction, so a small change
// is not held behind a large one. A selection with more than
// backgroundWeight rules is compiled in a goroutine; its pods wait, keeping
// their old entries, while the loop goes on with the others, and are
// written when it is done. Nor is a small change held behind a large one
// in the reconciler, which writes the rows in revision order: the deriver
// keeps at most about two chunks of rows ahead of it (flowControl,
// throttle.go), and a new change's first chunk is written at once.
type policyDeriver struct {
	log       *slog.Logger
	db        *statedb.DB
	endpoints statedb.Table[*endpoints.PolicyEndpoint]
	entries   statedb.RWTable[*PolicyMapEntry]
	// versions are the pods' versions (versions.go): a pod whose entries
	// change gets a new version, written whole.
	versions statedb.RWTable[*PodVersions]
	state    *policyVersions
	node     nodeconfig.Config
	// initDone marks policy-map-entries initialized; called once
	// policy-endpoints is initialized and its contents are compiled, so the
	// reconciler never prunes the maps against a partial desired state.
	initDone func(statedb.WriteTxn)

	// changed says which pod IPs a change recompiles: those the changed
	// objects list or listed, and those of every slice of their policies.
	changed *changedPods[*endpoints.PolicyEndpoint]
	// unions takes, within one transaction, the union of slices.
	unions *unions[*endpoints.PolicyEndpoint]
	// hosts indexes, per object key, its pods' node IPs by pod IP (for
	// objects with many pods).
	hosts map[string]*podHosts

	queue podQueue
	// flow holds started work back while the reconciler is more than a
	// window behind.
	flow flowControl
	// templates are the compiled selections, by selection key, kept while
	// there is work: pods of one selection share them.
	templates map[string]compiled
	// compiling are the selections being compiled in the background, by
	// key, with the pods that wait for them.
	compiling map[string]*backgroundCompile
	results   chan backgroundResult
	slots     chan struct{} // background compiles running at once
	wg        sync.WaitGroup

	// cleanOnly are the queued pods whose replaced version goes, with
	// nothing to recompile.
	cleanOnly map[netip.Addr]bool

	// bad holds, per pod IP, its entries that cannot be encoded (for
	// health).
	bad map[netip.Addr][]*PolicyMapEntry

	metrics *policyMetrics

	// returnMemory gives freed memory back to the OS once a change of at
	// least returnMemoryAfter entries is in the kernel (the cell's
	// returnMemory; nil: never).
	returnMemory      func()
	returnMemoryAfter int
}

// podHosts is the node IPs of an object's pods, by pod IP.
type podHosts struct {
	pe    *endpoints.PolicyEndpoint
	hosts map[netip.Addr]endpoints.PodEndpoint
}

// compiled is a selection's templates. It holds the selection, whose
// objects' addresses are its key: while it is kept, no other object can
// take one of their addresses and so the key.
type compiled struct {
	sel       selection
	templates []*policyTemplate
}

type backgroundCompile struct {
	sel     selection
	waiting map[netip.Addr]struct{}
	start   time.Time
}

type backgroundResult struct {
	key       string
	templates []*policyTemplate
}

// podQueue holds the pod IPs to recompile, as batches worked newest first;
// a pod queued again is worked in its newest batch only. A pod whose rows
// are more than a chunk keeps the rest of them in its batch (partial),
// written before the batch's next pod.
type podQueue struct {
	batches []*podBatch
	due     map[netip.Addr]uint64 // pod -> the batch it is due in
	partial map[netip.Addr]*podBatch
	seq     uint64
	round   uint64 // the transactions worked so far
}

type podBatch struct {
	seq     uint64
	pods    []netip.Addr
	partial *podWrite
	// worked is the round that first took work from the batch (0: none
	// yet): the batch is fresh, a new change, during that round.
	worked uint64
}

func (q *podQueue) push(pods []netip.Addr) {
	if len(pods) == 0 {
		return
	}
	if q.due == nil {
		q.due = map[netip.Addr]uint64{}
	}
	q.seq++
	for _, p := range pods {
		q.due[p] = q.seq
		if b := q.partial[p]; b != nil { // recompiled anew: the rest is stale
			b.partial = nil
			delete(q.partial, p)
		}
	}
	q.batches = append(q.batches, &podBatch{seq: q.seq, pods: pods})
}

// front drops the work done at the front of the queue and returns the
// batch the next work comes from; nil when there is none.
func (q *podQueue) front() *podBatch {
	for len(q.batches) > 0 {
		b := q.batches[len(q.batches)-1]
		if b.partial != nil {
			return b
		}
		for len(b.pods) > 0 && q.due[b.pods[0]] != b.seq {
			b.pods = b.pods[1:] // due in a newer batch
		}
		if len(b.pods) > 0 {
			return b
		}
		q.batches[len(q.batches)-1] = nil
		q.batches = q.batches[:len(q.batches)-1]
	}
	*q = podQueue{seq: q.seq, round: q.round} // a map does not shrink: drop it with the batches
	return nil
}

// fresh reports whether b is a new change: no work taken from it before
// this round.
func (q *podQueue) fresh(b *podBatch) bool { return b.worked == 0 || b.worked == q.round }

// hasWork reports whether there is work for the next round; with
// onlyFresh, work of a new change.
func (q *podQueue) hasWork(onlyFresh bool) bool {
	b := q.front()
	return b != nil && (!onlyFresh || b.worked == 0)
}

// pop returns the next work: a pod to recompile, or the rest of a pod's
// rows (w), and its batch; with onlyFresh, only from a new change.
func (q *podQueue) pop(onlyFresh bool) (pod netip.Addr, w *podWrite, b *podBatch, ok bool) {
	b = q.front()
	if b == nil || onlyFresh && !q.fresh(b) {
		return netip.Addr{}, nil, nil, false
	}
	if b.worked == 0 {
		b.worked = q.round
	}
	if w = q.resume(b); w != nil {
		return w.pod, w, b, true
	}
	pod = b.pods[0]
	b.pods = b.pods[1:]
	delete(q.due, pod)
	return pod, nil, b, true
}

// resume takes the rest of a pod's rows out of batch b; nil if none.
func (q *podQueue) resume(b *podBatch) *podWrite {
	w := b.partial
	if w != nil {
		b.partial = nil
		delete(q.partial, w.pod)
	}
	return w
}

// suspend keeps the rest of a pod's rows in its batch, b, the front one.
func (q *podQueue) suspend(b *podBatch, w *podWrite) {
	if q.partial == nil {
		q.partial = map[netip.Addr]*podBatch{}
	}
	b.partial = w
	q.partial[w.pod] = b
}

func (q *podQueue) empty() bool { return len(q.due) == 0 && len(q.partial) == 0 }

const (
	// defaultReturnMemoryAfter is the number of entries written in one go
	// after which the deriver returns freed memory to the OS once the
	// reconciler has written them (a PolicyEndpoint with 50,000 pods
	// writes 300,000).
	defaultReturnMemoryAfter = 100_000
	// settleCheck is how often the deriver looks whether such a change is
	// in the kernel (a scan of the table that stops at the first Pending
	// row).
	settleCheck = 250 * time.Millisecond
)

// run follows the changes of policy-endpoints until ctx is done.
func (d *policyDeriver) run(ctx context.Context, health cell.Health) error {
	if !d.state.wait(ctx) { // version numbers go on from an earlier run's
		return nil
	}
	wtxn := d.db.WriteTxn(d.endpoints, d.versions)
	changes, err := d.endpoints.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return fmt.Errorf("watch %s: %w", endpoints.PolicyEndpointsTableName, err)
	}
	defer changes.Close()
	versionChanges, err := d.versions.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("watch %s: %w", PolicyVersionsTableName, err)
	}
	defer versionChanges.Close()
	d.cleanOnly = map[netip.Addr]bool{}
	d.changed = newChangedPods(d.endpoints, endpoints.PolicyEndpointParentIndex)
	d.unions = newUnions(d.endpoints, endpoints.PolicyEndpointParentIndex)
	d.hosts = map[string]*podHosts{}
	d.templates = map[string]compiled{}
	d.compiling = map[string]*backgroundCompile{}
	d.results = make(chan backgroundResult)
	d.slots = make(chan struct{}, 1)
	d.bad = map[netip.Addr][]*PolicyMapEntry{}
	defer d.wg.Wait()

	var (
		pods, written int
		start         time.Time
		held          time.Duration // since start, waiting for the reconciler
		lastCompiling string
		settle        <-chan time.Time // armed after a large change
	)
	for {
		// Newer changes first: they become the front batch.
		affected, watch := d.nextChanges(changes)
		if len(affected) > 0 {
			if d.queue.empty() && len(d.compiling) == 0 {
				start, held, pods, written = time.Now(), 0, 0, 0
			}
			for _, p := range affected {
				delete(d.cleanOnly, p) // recompiled: cleaned up too
			}
			d.queue.push(affected)
		}
		// Pods whose last switch is in the kernel: the version it
		// replaced goes (cleanup).
		vbatch, versionWatch := versionChanges.Next(d.db.ReadTxn())
		if clean := needsCleanup(vbatch, bpf.TierNetworkPolicy); len(clean) > 0 {
			var queued []netip.Addr
			for _, p := range clean {
				if _, due := d.queue.due[p]; !due {
					d.cleanOnly[p] = true
					queued = append(queued, p)
				}
			}
			d.queue.push(queued)
		}

		// Started work goes on only while the reconciler is within the
		// window; a new change's is worked at once.
		open, window := true, (<-chan struct{})(nil)
		if !d.queue.empty() {
			open, window = d.flow.open(d.db.ReadTxn(), d.entries)
		}
		canWork := d.queue.hasWork(!open)
		var initWatch <-chan struct{}
		if canWork || d.initDone != nil && d.queue.empty() {
			wtxn := d.db.WriteTxn(d.entries, d.versions)
			p, w, mark := d.work(ctx, wtxn, !open)
			pods, written = pods+p, written+w
			if d.initDone != nil && d.queue.empty() && len(d.compiling) == 0 {
				// Every current object compiled and written (pruning
				// compares the maps with the whole table).
				if ok, ch := d.endpoints.Initialized(wtxn); ok {
					d.initDone(wtxn)
					d.initDone = nil
					n := d.entries.NumObjects(wtxn)
					d.log.Info("Policy map entries initialized", "entries", n)
					health.OK(fmt.Sprintf("Initialized: %d entries", n))
				} else {
					initWatch = ch
				}
			}
			wtxn.Commit()
			if mark.rows > 0 {
				d.flow.add(mark)
			}
		}
		if !d.queue.empty() {
			if canWork {
				// More to do: look for newer changes, then go on.
				select {
				case <-ctx.Done():
					return nil
				default:
					continue
				}
			}
			// The window is full: wait for the reconciler, taking newer
			// changes and finished compiles meanwhile.
			since := time.Now()
			select {
			case <-watch:
			case <-versionWatch:
			case <-window:
			case r := <-d.results:
				d.finished(r)
			case <-ctx.Done():
				return nil
			}
			held += time.Since(since)
			continue
		}
		clear(d.templates) // no work left: their pods are written
		clear(d.hosts)
		if c := d.compilingText(); pods > 0 || c != lastCompiling {
			if pods > 0 && len(d.compiling) == 0 {
				d.metrics.compiled(time.Since(start) - held) // compiling and writing: not the reconciler's pace
			}
			d.log.Debug("Compiled policy map entries", "pods", pods, "entries-written", written)
			if d.returnMemory != nil && written >= d.returnMemoryAfter && len(d.compiling) == 0 {
				settle = time.After(settleCheck)
			}
			d.report(health, fmt.Sprintf("%d pod IPs recompiled, %d entries written", pods, written))
			pods, written, lastCompiling = 0, 0, c
		}

		select {
		case <-watch:
		case <-versionWatch:
		case <-initWatch:
		case r := <-d.results:
			d.finished(r)
		case <-settle:
			settle = nil
			if d.anyPending() {
				settle = time.After(settleCheck)
				continue
			}
			// A large change, compiled, written and reconciled, leaves
			// the table's old rows and nodes, the compile's scratch and
			// the reconciler's batches as garbage: the Go runtime would
			// keep their pages, up to twice the live heap. Return them.
			d.returnMemory()
		case <-ctx.Done():
			return nil
		}
	}
}

// alloc hands out a new version.
func (d *policyDeriver) alloc() uint32 { return d.state.alloc(d.log) }

// anyPending reports whether some entry waits for the reconciler.
func (d *policyDeriver) anyPending() bool {
	for e := range d.entries.All(d.db.ReadTxn()) {
		if e.Status.Kind == reconciler.StatusKindPending {
			return true
		}
	}
	return false
}

// nextChanges returns the pod IPs that the changes since the last call
// list or listed, with the pods of every slice of their policies, and a
// channel closed on the next change. The batch's snapshot of the database
// is not kept: held while the deriver waits, it would keep every row the
// reconciler has since replaced.
func (d *policyDeriver) nextChanges(changes statedb.ChangeIterator[*endpoints.PolicyEndpoint]) ([]netip.Addr, <-chan struct{}) {
	txn := d.db.ReadTxn()
	batch, watch := changes.Next(txn)
	return d.affected(txn, batch), watch
}

// affected returns the pod IPs that a batch of changes recompiles
// (changedPods).
func (d *policyDeriver) affected(txn statedb.ReadTxn, batch func(func(statedb.Change[*endpoints.PolicyEndpoint], statedb.Revision) bool)) []netip.Addr {
	return sortedAddrs(d.changed.affected(txn, batch, func(key string) { delete(d.hosts, key) }))
}

// finished takes a background compile's templates and queues its pods.
func (d *policyDeriver) finished(r backgroundResult) {
	bc := d.compiling[r.key]
	delete(d.compiling, r.key)
	if bc == nil {
		return
	}
	d.log.Debug("Compiled a large selection", "objects", bc.sel.names(), "pods", len(bc.waiting), "duration", time.Since(bc.start))
	d.templates[r.key] = compiled{sel: bc.sel, templates: r.templates}
	d.queue.push(sortedAddrs(bc.waiting))
}

// work recompiles queued pods in wtxn until about chunkEntries entries are
// compiled or rows written, or none is left; with onlyFresh, only the work
// of new changes. It returns the pods and rows written, and the mark of
// the transaction for the flow control (no rows: nothing to watch).
func (d *policyDeriver) work(ctx context.Context, wtxn statedb.WriteTxn, onlyFresh bool) (pods, written int, mark reconcileMark) {
	// The rows before this transaction, read from a snapshot: wtxn holds
	// the table's lock, so nothing else changes them, and this chunk
	// writes each pod once.
	before := d.db.ReadTxn()
	d.unions.reset()
	chunk := d.flow.chunkRows()
	d.queue.round++
	entries := 0
	var last *PolicyMapEntry
	for entries < chunk && written < chunk {
		pod, w, b, ok := d.queue.pop(onlyFresh)
		if !ok {
			break
		}
		if w == nil && d.cleanOnly[pod] {
			delete(d.cleanOnly, pod)
			tv, done := tierOf(wtxn, d.versions, pod, bpf.TierNetworkPolicy)
			stale, next := cleanup(podRows(before, d.entries, pod), tv, done)
			if next != tv {
				setTier(wtxn, d.versions, pod, bpf.TierNetworkPolicy, next)
			}
			w = &podWrite{pod: pod, stale: stale}
		} else if w == nil {
			desired, ok := d.desired(ctx, wtxn, pod)
			if !ok {
				continue // compiling in the background
			}
			entries += len(desired)
			pods++
			d.noteBad(pod, desired)
			tv, done := tierOf(wtxn, d.versions, pod, bpf.TierNetworkPolicy)
			var next TierVersions
			var changed bool
			w, next, changed = diffPod(before, d.entries, pod, tv, done, desired, d.alloc)
			if changed && next != tv {
				setTier(wtxn, d.versions, pod, bpf.TierNetworkPolicy, next)
			}
		}
		limit := chunk - written
		if w.rows() <= chunk {
			limit = w.rows() // a pod's rows in one transaction, if they fit in a chunk
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
				d.queue.resume(b) // written whole
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

// desired compiles a pod's entries; false while its selection compiles in
// the background (the pod waits for it).
func (d *policyDeriver) desired(ctx context.Context, wtxn statedb.WriteTxn, pod netip.Addr) ([]*PolicyMapEntry, bool) {
	var desired []*PolicyMapEntry
	if !d.node.FamilyEnabled(pod) || pod.Is4In6() {
		return nil, true
	}
	listing := statedb.Collect(d.endpoints.List(wtxn, endpoints.PolicyEndpointPodIndex.Query(pod)))
	sel, ok := selectionOf(pod, d.unions.of(wtxn, listing), listing, d.hostsOf(pod))
	if !ok {
		return nil, true
	}
	key := sel.key()
	c, ok := d.templates[key]
	ts := c.templates
	if !ok {
		if bc := d.compiling[key]; bc != nil {
			bc.waiting[pod] = struct{}{}
			return nil, false
		}
		if sel.weight() > backgroundWeight {
			d.compileInBackground(ctx, key, sel, pod)
			return nil, false
		}
		ts = compileSelection(sel)
		d.templates[key] = compiled{sel: sel, templates: ts}
	}
	for _, t := range ts {
		desired = t.stamp(desired, pod)
	}
	return desired, true
}

// hostsOf returns the function that finds pod's entry in an object.
func (d *policyDeriver) hostsOf(pod netip.Addr) func(*endpoints.PolicyEndpoint) (endpoints.PodEndpoint, bool) {
	return func(pe *endpoints.PolicyEndpoint) (endpoints.PodEndpoint, bool) {
		if len(pe.Pods) <= 8 {
			return pe.PodEntry(pod)
		}
		h := d.hosts[pe.Key()]
		if h == nil || h.pe != pe {
			h = &podHosts{pe: pe, hosts: make(map[netip.Addr]endpoints.PodEndpoint, len(pe.Pods))}
			for _, p := range pe.Pods {
				h.hosts[p.PodIP] = p
			}
			d.hosts[pe.Key()] = h
		}
		e, ok := h.hosts[pod]
		return e, ok
	}
}

// compileInBackground compiles a selection in a goroutine, one at a time;
// pod waits for it.
func (d *policyDeriver) compileInBackground(ctx context.Context, key string, sel selection, pod netip.Addr) {
	d.compiling[key] = &backgroundCompile{sel: sel, waiting: map[netip.Addr]struct{}{pod: {}}, start: time.Now()}
	d.log.Debug("Compiling a large selection in the background", "objects", sel.names(), "weight", sel.weight())
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		select {
		case d.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		ts := compileSelection(sel)
		<-d.slots
		select {
		case d.results <- backgroundResult{key: key, templates: ts}:
		case <-ctx.Done():
		}
	}()
}

// names are the keys of the selection's objects.
func (s selection) names() string {
	var out []string
	for _, pe := range s.pes {
		out = append(out, pe.Key())
	}
	return strings.Join(out, ",")
}

// noteBad records the pod's entries that cannot be encoded.
func (d *policyDeriver) noteBad(pod netip.Addr, desired []*PolicyMapEntry) {
	var bad []*PolicyMapEntry
	for _, e := range desired {
		if e.EncodeError() != "" {
			bad = append(bad, e)
		}
	}
	if len(bad) == 0 {
		delete(d.bad, pod)
		return
	}
	d.bad[pod] = bad
}

// report sets health: Degraded, naming a few, while entries cannot be
// encoded (they deny: fail closed), OK otherwise; it names the objects
// compiling in the background.
func (d *policyDeriver) report(health cell.Health, ok string) {
	var bad []*PolicyMapEntry
	for _, es := range d.bad {
		bad = append(bad, es...)
	}
	if n := len(bad); n > 0 {
		slices.SortFunc(bad, func(a, b *PolicyMapEntry) int {
			return cmp.Compare(string(policyEntryID(a.Map(), a.Pod, a.Peer(), a.Version)), string(policyEntryID(b.Map(), b.Pod, b.Peer(), b.Version)))
		})
		var msgs []string
		for _, e := range bad[:min(n, 3)] {
			msgs = append(msgs, fmt.Sprintf("%s %s %s: %s", e.Map(), e.Pod, e.Peer(), e.EncodeError()))
		}
		health.Degraded(fmt.Sprintf("%d policy map entries cannot be encoded and deny (fail closed)", n),
			errors.New(strings.Join(msgs, "; ")))
		return
	}
	if c := d.compilingText(); c != "" {
		ok += "; " + c
	}
	health.OK(ok)
}

// compilingText names the objects compiling in the background.
func (d *policyDeriver) compilingText() string {
	var out []string
	for _, bc := range d.compiling {
		out = append(out, fmt.Sprintf("compiling %s (%d rules and excepts) for %d pod IPs", bc.sel.names(), bc.sel.weight(), len(bc.waiting)))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

func sortedAddrs(set map[netip.Addr]struct{}) []netip.Addr {
	out := make([]netip.Addr, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
