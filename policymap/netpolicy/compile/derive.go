package compile

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

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

// deriver keeps a kind's map-entries table (policy-map-entries,
// cluster-policy-map-entries) equal to the compilation of its objects
// (policy-endpoints, cluster-policy-endpoints; kinds.go). On a change it recompiles only the pod IPs that the
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
//
// One runs per kind, apart: neither waits for the other's table (an API
// server without the ClusterPolicyEndpoint CRD never holds up
// PolicyEndpoints).
type deriver[T policyRow[T], K kind[T]] struct {
	log       *slog.Logger
	db        *statedb.DB
	endpoints statedb.Table[T]
	// names are the addresses pods were told of the names of name rules
	// (names.go); nil in tests without them.
	names   statedb.Table[*endpoints.DNSName]
	entries statedb.RWTable[*MapEntry[K]]
	// versions are the pods' versions (versions.go): a pod whose entries
	// change gets a new version, written whole.
	versions statedb.RWTable[*PodVersions]
	state    *policyVersions
	node     nodeconfig.Config
	// initDone marks the entries initialized; called once the objects'
	// table is initialized and its contents are compiled, so the
	// reconciler never prunes the maps against a partial desired state.
	initDone func(statedb.WriteTxn)

	// changed says which pod IPs a change recompiles: those the changed
	// objects list or listed, and those of every slice of their policies.
	changed *changedPods[T]
	// unions takes, within one transaction, the union of slices.
	unions *unions[T]
	// hosts indexes, per object key, its pods' node IPs by pod IP (for
	// objects with many pods).
	hosts map[string]*podHosts[T]

	queue podQueue[K]
	// flow holds started work back while the reconciler is more than a
	// window behind.
	flow flowControl
	// templates are the compiled selections, by selection key, kept while
	// there is work: pods of one selection share them.
	templates map[string]compiled[T]
	// compiling are the selections being compiled in the background, by
	// key, with the pods that wait for them.
	compiling map[string]*backgroundCompile[T]
	results   chan backgroundResult
	slots     chan struct{} // background compiles running at once
	wg        sync.WaitGroup

	// stamped are, per pod, the templates its rows of the newest
	// version are the entries of (delta.go), and deltas the differences
	// of templates computed this round.
	stamped map[netip.Addr][]*policyTemplate
	deltas  map[string]*templateDelta

	// cleanOnly are the queued pods whose replaced version goes, with
	// nothing to recompile; cleanLater those to queue so once their write
	// in parts is done.
	cleanOnly  map[netip.Addr]bool
	cleanLater map[netip.Addr]bool

	// bad holds, per pod IP, its entries that cannot be encoded (for
	// health).
	bad map[netip.Addr][]*MapEntry[K]

	// adoption counts what was taken over of an earlier run's versions.
	adoption adoptionCounts
	// requeue are pods to compile again after this round (not in it: a
	// round writes a pod once, diffing against its snapshot).
	requeue []netip.Addr

	// prune asks the kind's reconciler for a prune of its maps (nil in
	// tests without one): the keys of a version restored from an earlier
	// run have no row (pruneRestored).
	prune *pruneTrigger

	// metrics are nil for a kind that is not timed (kind.timed).
	metrics *policyMetrics

	// returnMemory gives freed memory back to the OS once a change of at
	// least returnMemoryAfter entries is in the kernel (the cell's
	// returnMemory; nil: never).
	returnMemory      func()
	returnMemoryAfter int
}

// policyDeriver is the deriver of PolicyEndpoints.
type policyDeriver = deriver[*endpoints.PolicyEndpoint, policyKind]

// podHosts is the node IPs of an object's pods, by pod IP.
type podHosts[T any] struct {
	obj   T
	hosts map[netip.Addr]endpoints.PodEndpoint
}

// compiled is a selection's templates. It holds the selection, whose
// objects' addresses are its key: while it is kept, no other object can
// take one of their addresses and so the key.
type compiled[T endpoints.Slice] struct {
	sel       selection[T]
	templates []*policyTemplate
}

type backgroundCompile[T endpoints.Slice] struct {
	sel     selection[T]
	waiting map[netip.Addr]struct{}
	start   time.Time
}

type backgroundResult struct {
	key       string
	templates []*policyTemplate
}

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

// run follows the changes of the kind's objects until ctx is done.
func (d *deriver[T, K]) run(ctx context.Context, health cell.Health) error {
	if !d.state.wait(ctx) { // version numbers go on from an earlier run's
		return nil
	}
	var k K
	tables := []statedb.TableMeta{d.endpoints, d.versions}
	if d.names != nil {
		tables = append(tables, d.names)
	}
	wtxn := d.db.WriteTxn(tables...)
	changes, err := d.endpoints.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return fmt.Errorf("watch %s: %w", d.endpoints.Name(), err)
	}
	defer changes.Close()
	var nameChanges statedb.ChangeIterator[*endpoints.DNSName]
	if d.names != nil {
		if nameChanges, err = d.names.Changes(wtxn); err != nil {
			wtxn.Abort()
			return fmt.Errorf("watch %s: %w", d.names.Name(), err)
		}
		defer nameChanges.Close()
	}
	namesSeen := map[string]*endpoints.DNSName{}
	versionChanges, err := d.versions.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("watch %s: %w", PolicyVersionsTableName, err)
	}
	defer versionChanges.Close()
	d.cleanOnly = map[netip.Addr]bool{}
	d.cleanLater = map[netip.Addr]bool{}
	d.stamped = map[netip.Addr][]*policyTemplate{}
	d.deltas = map[string]*templateDelta{}
	d.changed = newChangedPods(d.endpoints, k.parentIndex())
	d.unions = newUnions(d.endpoints, k.parentIndex())
	d.hosts = map[string]*podHosts[T]{}
	d.templates = map[string]compiled[T]{}
	d.compiling = map[string]*backgroundCompile[T]{}
	d.results = make(chan backgroundResult)
	d.slots = make(chan struct{}, 1)
	d.bad = map[netip.Addr][]*MapEntry[K]{}
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
		affected, watch, initialized := d.nextChanges(changes)
		var namesWatch <-chan struct{}
		if nameChanges != nil {
			var batch func(func(statedb.Change[*endpoints.DNSName], statedb.Revision) bool)
			batch, namesWatch = nameChanges.Next(d.db.ReadTxn())
			affected = mergeAddrs(affected, namesChanged(batch, namesSeen))
		}
		if len(affected) > 0 {
			if d.queue.empty() && len(d.compiling) == 0 {
				start, held, pods, written = time.Now(), 0, 0, 0
			}
			for _, p := range affected {
				delete(d.cleanOnly, p) // recompiled: cleaned up too
				delete(d.cleanLater, p)
			}
			d.queue.push(affected)
		}
		// Pods whose last switch is in the kernel: the version it
		// replaced goes (cleanup).
		vbatch, versionWatch := versionChanges.Next(d.db.ReadTxn())
		// Pods whose new version waited for room (room.go) are written
		// now.
		if released := d.state.takeReleased(k.tier()); len(released) > 0 {
			for _, p := range released {
				delete(d.stamped, p) // its newest rows went: diffed whole
			}
			d.queue.push(released)
		}
		if clean := needsCleanup(vbatch, k.tier()); len(clean) > 0 {
			var queued []netip.Addr
			for _, p := range clean {
				if _, due := d.queue.due[p]; due {
					continue // recompiled: cleaned up too
				}
				if d.queue.partial[p] != nil {
					// Being written in parts: cleaned up after its write
					// (queued anew, its write would be dropped).
					d.cleanLater[p] = true
					continue
				}
				d.cleanOnly[p] = true
				queued = append(queued, p)
			}
			d.queue.push(queued)
		}

		// Started work goes on only while the reconciler is within the
		// window; a new change's is worked at once.
		open, window := true, (<-chan struct{})(nil)
		if !d.queue.empty() {
			open, window = flowOpen(&d.flow, d.db.ReadTxn(), d.entries)
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
				// Initialized as of the snapshot the changes were read
				// from: one that the source initialized after would
				// hold objects not yet queued.
				if ok, ch := initialized(); ok {
					d.initDone(wtxn)
					d.initDone = nil
					n := d.entries.NumObjects(wtxn)
					d.log.Info("Policy map entries initialized", "entries", n)
					if a := d.adoption; a.pods > 0 || a.renewed > 0 {
						// A restart: what the kernel held, taken over.
						d.log.Info("Policy versions of the earlier run taken over", "table", k.tableName(), "pods", a.pods,
							"entries-kept", a.rows, "entries-written", a.written, "keys-to-delete", a.extra, "pods-with-new-versions", a.renewed)
					}
					health.OK(fmt.Sprintf("Initialized: %d entries", n))
				} else {
					initWatch = ch
				}
			}
			wtxn.Commit()
			if mark.rows > 0 {
				d.flow.add(mark)
			}
			d.queue.push(d.requeue)
			d.requeue = nil
			d.queueCleanLater()
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
			case <-namesWatch:
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
		case <-namesWatch:
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

// queueCleanLater queues for cleanup the pods that waited for their write
// in parts to be done.
func (d *deriver[T, K]) queueCleanLater() {
	queued := map[netip.Addr]struct{}{}
	for p := range d.cleanLater {
		if d.queue.partial[p] != nil {
			continue
		}
		delete(d.cleanLater, p)
		if _, due := d.queue.due[p]; !due {
			d.cleanOnly[p] = true
			queued[p] = struct{}{}
		}
	}
	d.queue.push(sortedAddrs(queued))
}

// alloc hands out a new version.
func (d *deriver[T, K]) alloc() uint32 { return d.state.alloc(d.log) }

// anyPending reports whether some entry waits for the reconciler.
func (d *deriver[T, K]) anyPending() bool {
	for e := range d.entries.All(d.db.ReadTxn()) {
		if e.Status.Kind == reconciler.StatusKindPending {
			return true
		}
	}
	return false
}

// nextChanges returns the pod IPs that the changes since the last call
// list or listed, with the pods of every slice of their policies, a
// channel closed on the next change, and whether the objects' table was
// initialized in the same snapshot (initialized later, it may hold objects
// this batch has not queued). The batch's snapshot of the database
// is not kept: held while the deriver waits, it would keep every row the
// reconciler has since replaced.
func (d *deriver[T, K]) nextChanges(changes statedb.ChangeIterator[T]) ([]netip.Addr, <-chan struct{}, func() (bool, <-chan struct{})) {
	txn := d.db.ReadTxn()
	batch, watch := changes.Next(txn)
	ok, initWatch := d.endpoints.Initialized(txn)
	return d.affected(txn, batch), watch, func() (bool, <-chan struct{}) { return ok, initWatch }
}

// affected returns the pod IPs that a batch of changes recompiles
// (changedPods).
func (d *deriver[T, K]) affected(txn statedb.ReadTxn, batch func(func(statedb.Change[T], statedb.Revision) bool)) []netip.Addr {
	return sortedAddrs(d.changed.affected(txn, batch, func(key string) { delete(d.hosts, key) }))
}

// finished takes a background compile's templates and queues its pods.
func (d *deriver[T, K]) finished(r backgroundResult) {
	bc := d.compiling[r.key]
	delete(d.compiling, r.key)
	if bc == nil {
		return
	}
	d.log.Debug("Compiled a large selection", "objects", bc.sel.names(), "pods", len(bc.waiting), "duration", time.Since(bc.start))
	d.templates[r.key] = compiled[T]{sel: bc.sel, templates: r.templates}
	d.queue.push(sortedAddrs(bc.waiting))
}
