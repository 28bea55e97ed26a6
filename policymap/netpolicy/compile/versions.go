package compile

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap"
)

// Versions of a pod's policy.
//
// A pod's policy changes in one step. The derivers never change the rows
// of a version that may be in force: a pod whose compiled entries change
// gets a new version, all its entries written anew under it (versionDiff),
// while the old version stays in force. The switch (switch.go) brings the
// new version into force once every one of its entries is in the kernel
// (Done) — one update of the pod's entry in enimasq_policy_versions, per
// tier — and deletes the old version's entries only once that update is
// Done. A version that cannot be written whole (a full map, an error)
// never comes into force: the pod keeps the version it has, or, with
// none, is closed (policybpf.PolicyVersionClosed: denied), and health names the
// pod, its objects and the reason until it is written.
//
// Versions are numbered for the whole node, from 1; the numbers handed out
// are recorded in the kernel (policybpf.SetPolicyVersionsHighWater) before use,
// so an agent that restarts never reuses a number whose entries an earlier
// run may have left behind. The prune of the policy maps keeps the
// entries of the versions the kernel has in force (keep), so a restart
// never deletes them before their pod has switched to the new run's.

// versionBlock is how many version numbers are recorded as handed out at
// a time.
const versionBlock = 1 << 16

// policyVersions hands out version numbers and holds the versions map.
type policyVersions struct {
	maps *policymap.Maps[*PodVersions]

	mu        sync.Mutex
	next      uint32
	highWater uint32 // recorded in the kernel: numbers below are handed out

	// closing is held (read) by the prune's lookups and (write) by close:
	// the maps are closed at stop while a reconciler may still prune.
	closing sync.RWMutex
	closed  bool

	// ready is closed once the versions an earlier run left are read
	// (restore): no number is handed out before.
	ready    chan struct{}
	restored map[netip.Addr][2]uint32
	// adoptable are their entries in the kernel, taken once per pod and
	// tier by the derivers (adopt.go).
	adoptable adoptable

	// released are, per tier, the pods whose new version waited for room
	// and may be written now (room.go): the switch adds, the tier's
	// deriver takes them (under mu).
	released [len(tiers)][]netip.Addr

	// table is policy-versions (set at registration): the prune keeps a
	// version's keys only while the run has not taken it over.
	db    *statedb.DB
	table statedb.Table[*PodVersions]
}

func newPolicyVersions(p policymap.MapsParams) *policyVersions {
	return &policyVersions{maps: policymap.NewMaps[*PodVersions](p, PolicyVersionsTableName), next: 1, ready: make(chan struct{})}
}

// wait waits until the versions an earlier run left are read; false if ctx
// is done first.
func (v *policyVersions) wait(ctx context.Context) bool {
	select {
	case <-v.ready:
		return true
	case <-ctx.Done():
		return false
	}
}

// kernelMaps are the versions map's operations (one map).
func (v *policyVersions) kernelMaps() *policymap.Maps[*PodVersions] { return v.maps }

// versionsMap is the open versions map, nil before start.
func (v *policyVersions) versionsMap() bpf.PinnedMap {
	return v.maps.Opened()[policybpf.PolicyVersionsMapName]
}

// alloc hands out a new version number.
func (v *policyVersions) alloc(log *slog.Logger) uint32 {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.next == 0 || v.next == policybpf.PolicyVersionClosed {
		v.next = 1 // after 4 billion versions
	}
	n := v.next
	v.next++
	if n >= v.highWater || v.highWater-n > versionBlock {
		hw := n + versionBlock
		if m := v.versionsMap(); m != nil {
			if err := policybpf.SetPolicyVersionsHighWater(m, hw); err != nil {
				log.Warn("Cannot record the policy versions handed out: a restart may reuse them", "error", err)
			}
		}
		v.highWater = hw
	}
	return n
}

// restore reads the versions the kernel has in force (an earlier run's)
// and the numbers handed out, so that this run goes on from them; then
// the derivers may hand out numbers (ready). Called once, at start.
func (v *policyVersions) restore() error {
	m := v.versionsMap()
	if m == nil {
		return nil
	}
	pods, hw, err := policybpf.PolicyVersions(m)
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.restored = pods
	next := hw
	for _, vs := range pods {
		for _, x := range vs {
			if x != policybpf.PolicyVersionClosed && x >= next {
				next = x + 1
			}
		}
	}
	if next > v.next {
		v.next = next
	}
	v.highWater = hw
	return nil
}

// setAdoptable keeps the kernel's entries of the restored versions.
func (v *policyVersions) setAdoptable(a adoptable) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.adoptable = a
}

// takeAdoptable returns the kernel's entries of a pod's tier at its
// restored version, once; nil if none were read.
func (v *policyVersions) takeAdoptable(tier policybpf.PolicyTier, pod netip.Addr) map[PolicyEntryKey]string {
	v.mu.Lock()
	defer v.mu.Unlock()
	tp := tierPod{tier, pod}
	a := v.adoptable[tp]
	delete(v.adoptable, tp)
	if len(v.adoptable) == 0 {
		v.adoptable = nil // a map does not shrink
	}
	return a
}

// markReady lets the derivers hand out numbers: the restored versions are
// in policy-versions.
func (v *policyVersions) markReady() { close(v.ready) }

// takeRestored returns the restored versions, once.
func (v *policyVersions) takeRestored() map[netip.Addr][2]uint32 {
	v.mu.Lock()
	defer v.mu.Unlock()
	r := v.restored
	v.restored = nil
	return r
}

// close closes the versions map (its pin stays), once no prune is
// looking it up; a prune after keeps every key.
func (v *policyVersions) close() {
	v.closing.Lock()
	defer v.closing.Unlock()
	v.closed = true
	v.maps.Close()
}

// inForce returns the versions the kernel has in force for a pod; closed:
// the map was closed (the agent is stopping), nothing is known.
func (v *policyVersions) inForce(m bpf.PinnedMap, pod netip.Addr) (vs [2]uint32, ok, closed bool) {
	v.closing.RLock()
	defer v.closing.RUnlock()
	if v.closed {
		return [2]uint32{}, false, true
	}
	vs, ok = v.lookup(m, pod)
	return vs, ok, false
}

func (v *policyVersions) lookup(m bpf.PinnedMap, pod netip.Addr) ([2]uint32, bool) {
	val := make([]byte, policybpf.PolicyVersionValueSize)
	if err := m.Lookup(policybpf.PolicyPodKey(pod), val); err != nil {
		return [2]uint32{}, false
	}
	np, cl, err := policybpf.DecodePolicyVersions(val)
	if err != nil {
		return [2]uint32{}, false
	}
	return [2]uint32{np, cl}, true
}

// keep is the prune's KeepFunc for the maps of a tier: it keeps the keys
// of the version the kernel has in force for their pod (and the chunks
// of their values), which no row may hold after a restart, until this run
// takes the version over (adopt.go: its rows are then the version's
// keys, and the kernel's keys no row holds go).
func (v *policyVersions) keep(tier policybpf.PolicyTier, kernel func() map[string]bpf.PinnedMap) bpf.KeepFunc {
	return func(txn statedb.ReadTxn) func(string, []byte) bool {
		versions := v.versionsMap()
		if versions == nil {
			return func(string, []byte) bool { return false }
		}
		// txn is the snapshot the prune read the desired rows from: a pod
		// taken over after it keeps its keys in this prune.
		if txn == nil && v.db != nil {
			txn = v.db.ReadTxn()
		}
		takenOver := func(pod netip.Addr, version uint32) bool {
			if txn == nil || v.table == nil {
				return false
			}
			row, _, ok := v.table.Get(txn, PodVersionsIndex.Query(pod))
			// A version taken back for want of room (room.go) leaves
			// Want at the version in force, which this run may not have
			// taken over: not taken over while Waiting.
			return ok && row.Tiers[tier].Want == version && !row.Tiers[tier].Waiting
		}
		open := kernel()
		lists := map[string]bool{} // chunk list ids of kept values
		// unknown: a kept key's value could not be read (the agent is
		// stopping): its chunks are not known, so every chunk stays.
		unknown := false
		return func(name string, key []byte) bool {
			if len(key) == policybpf.PolicyChunkKeySize {
				return unknown || lists[string(key[:16])]
			}
			var f bpf.Family
			switch len(key) {
			case bpf.PolicyKeySizeV4:
				f = bpf.IPv4
			case bpf.PolicyKeySizeV6:
				f = bpf.IPv6
			default:
				return false
			}
			pod, version, _, err := bpf.UnmarshalPolicyKeyVersion(f, key)
			if err != nil || version == policybpf.PolicyVersionNone {
				return false
			}
			vs, ok, closed := v.inForce(versions, pod)
			if closed {
				unknown = true
				return true // stopping: nothing is pruned on what is not known
			}
			if !ok || vs[tier] != version || takenOver(pod, version) {
				return false
			}
			if m := open[name]; m != nil {
				val := make([]byte, policybpf.PolicyValueSize)
				switch err := m.Lookup(key, val); {
				case err == nil:
					lists[string(val[8:24])] = true
				case !errors.Is(err, ebpf.ErrKeyNotExist):
					unknown = true
				}
			}
			return true
		}
	}
}

// versionedRow is what the rows of both tiers have in common.
type versionedRow[E any] interface {
	comparable
	Key() PolicyEntryKey
	GetStatus() reconciler.Status
	sameDesired(E) bool
	// atVersion is a copy at a version, Pending.
	atVersion(uint32) E
}

// versionDiff compares a pod's desired entries (at no version) with the
// rows of its newest version (tv.Want; rows are the pod's rows of the
// tier; done: the pod's versions row is Done, the kernel has tv.Active in
// force and no longer tv.Prev). Unchanged, it returns no fresh rows.
// Changed, the version in force is edited in place if edit (canEdit) and
// the edit is safe (editInPlace), and otherwise the desired entries are
// written whole under a new version (alloc). Either way the pod's rows of
// versions neither in force nor newest go (an older Want that never came
// into force; with done, the version the last switch replaced), and next
// is the tier's versions after it.
func versionDiff[E versionedRow[E]](rows iter.Seq[E], tv TierVersions, done, edit bool, desired []E, alloc func() uint32) (fresh, stale []E, next TierVersions, changed bool) {
	inForce := func(v uint32) bool { return v == tv.Active || !done && v == tv.Prev }
	current := map[PolicyEntryKey]E{}
	var active map[PolicyEntryKey]E // the rows in force, while a newer version is on the way
	if tv.Active != tv.Want {
		active = map[PolicyEntryKey]E{}
	}
	for r := range rows {
		k := r.Key()
		switch {
		case k.Version == tv.Want && tv.Want != policybpf.PolicyVersionNone:
			k.Version = 0
			current[k] = r
		case active != nil && k.Version == tv.Active:
			k.Version = 0
			active[k] = r
		case !inForce(k.Version):
			stale = append(stale, r)
		}
	}
	next = tv
	if done {
		next.Prev = policybpf.PolicyVersionNone
	}
	if same(current, desired) {
		return nil, stale, next, len(stale) > 0 || next != tv
	}
	if len(desired) > 0 && same(active, desired) && allInKernel(active) {
		// Back to the policy in force: the version on the way goes, and
		// nothing is written (it may be one that does not fit).
		for _, r := range current {
			stale = append(stale, r)
		}
		next.Want, next.Rows, next.Failed = tv.Active, len(desired), ""
		return nil, stale, next, true
	}
	if edit && len(desired) > 0 {
		if f, s, ok := editInPlace(current, desired, tv.Active); ok {
			next.Rows, next.Editing = len(desired), true
			return f, append(stale, s...), next, true
		}
	}
	if !inForce(tv.Want) {
		for _, r := range current {
			stale = append(stale, r)
		}
	}
	next.Want, next.Rows, next.Failed = policybpf.PolicyVersionNone, 0, "" // Editing: the version in force's, as the switch finds it
	if len(desired) > 0 {
		next.Want, next.Rows = alloc(), len(desired)
		fresh = make([]E, len(desired))
		for i, d := range desired {
			fresh[i] = d.atVersion(next.Want)
		}
	}
	return fresh, stale, next, true
}

// same says whether rows (by key at version 0) are the desired entries.
func same[E versionedRow[E]](rows map[PolicyEntryKey]E, desired []E) bool {
	if len(rows) != len(desired) {
		return false
	}
	for _, d := range desired {
		if r, ok := rows[d.Key()]; !ok || !r.sameDesired(d) {
			return false
		}
	}
	return true
}

// allInKernel says whether the kernel holds every one of rows.
func allInKernel[E versionedRow[E]](rows map[PolicyEntryKey]E) bool {
	for _, r := range rows {
		if !inKernel(r.GetStatus()) {
			return false
		}
	}
	return true
}

// cleanup returns a pod's rows of versions neither in force nor newest
// (see versionDiff), without compiling the pod, and its versions after.
func cleanup[E versionedRow[E]](rows iter.Seq[E], tv TierVersions, done bool) (stale []E, next TierVersions) {
	next = tv
	if done {
		next.Prev = policybpf.PolicyVersionNone
	}
	for r := range rows {
		if v := r.Key().Version; v != tv.Want && v != tv.Active && (done || v != tv.Prev) {
			stale = append(stale, r)
		}
	}
	return stale, next
}

// replacedWithoutRows says whether the version a pod's tier has just left
// (tv.Prev, out of force: done) has no rows. Every version this run hands
// out has rows (a pod with no entries gets none), so it is an earlier
// run's, restored from the kernel (registerVersions): its keys are in the
// maps with no row whose deletion removes them, and only a prune does
// (the prune keeps a version's keys only while it is in force: keep).
func replacedWithoutRows[E versionedRow[E]](rows iter.Seq[E], tv TierVersions, done bool) bool {
	if !done || tv.Prev == policybpf.PolicyVersionNone || tv.Prev == policybpf.PolicyVersionClosed {
		return false
	}
	for r := range rows {
		if r.Key().Version == tv.Prev {
			return false
		}
	}
	return true
}

// needsCleanup lists the pods whose versions row of a tier, in a batch of
// changes, has a replaced version whose rows may go (Done, Prev set).
func needsCleanup(batch iter.Seq2[statedb.Change[*PodVersions], statedb.Revision], tier policybpf.PolicyTier) []netip.Addr {
	var out []netip.Addr
	for c := range batch {
		if !c.Deleted && c.Object.Tiers[tier].Prev != policybpf.PolicyVersionNone && c.Object.Status.Kind == reconciler.StatusKindDone {
			out = append(out, c.Object.Pod)
		}
	}
	return out
}

// setTier records a tier's versions in the pod's row (made if missing),
// keeping its status: the kernel's entry changes only when the switch
// changes Active. A row left with no version of any tier goes.
func setTier(wtxn statedb.WriteTxn, table statedb.RWTable[*PodVersions], pod netip.Addr, tier policybpf.PolicyTier, tv TierVersions) {
	row, _, ok := table.Get(wtxn, PodVersionsIndex.Query(pod))
	if !ok {
		row = &PodVersions{Pod: pod, Status: reconciler.StatusDone()}
	} else {
		row = row.Clone()
	}
	row.Tiers[tier] = tv
	if row.empty() && row.Status.Kind == reconciler.StatusKindDone {
		if ok {
			table.Delete(wtxn, row)
		}
		return
	}
	table.Insert(wtxn, row)
}

// tierOf reads a pod's versions of a tier in txn, and whether its row is
// Done (the kernel has Active in force).
func tierOf(txn statedb.ReadTxn, table statedb.Table[*PodVersions], pod netip.Addr, tier policybpf.PolicyTier) (TierVersions, bool) {
	row, _, ok := table.Get(txn, PodVersionsIndex.Query(pod))
	if !ok {
		return TierVersions{}, true
	}
	k := row.Status.Kind
	return row.Tiers[tier], k == reconciler.StatusKindDone || k == reconciler.StatusKindRefreshing
}

// othersQuiet says whether a pod's tiers other than tier have no edit on
// the way (not Editing: the kernel holds their version in force whole): an
// edit of tier in place then meets them as they are (edit.go). A new
// version of another tier waits for the edit to be whole before it
// switches (switchTiers).
func othersQuiet(txn statedb.ReadTxn, table statedb.Table[*PodVersions], pod netip.Addr, tier policybpf.PolicyTier) bool {
	row, _, ok := table.Get(txn, PodVersionsIndex.Query(pod))
	if !ok {
		return true
	}
	for i, t := range row.Tiers {
		if policybpf.PolicyTier(i) != tier && t.Editing {
			return false
		}
	}
	return true
}

// openVersionsMap is the spec of the versions map, for the start hook.
func versionsMapSpec() (*ebpf.MapSpec, error) {
	spec, err := policybpf.PolicyVersionsSpec()
	if err != nil {
		return nil, fmt.Errorf("versions map: %w", err)
	}
	return spec, nil
}

// release hands pods whose new version waited for room to the tier's
// deriver.
func (v *policyVersions) release(tier policybpf.PolicyTier, pods ...netip.Addr) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.released[tier] = append(v.released[tier], pods...)
}

// takeReleased returns the pods of the tier released since the last call.
func (v *policyVersions) takeReleased(tier policybpf.PolicyTier) []netip.Addr {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.released[tier]
	v.released[tier] = nil
	return out
}
