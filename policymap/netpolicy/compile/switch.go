package compile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// versionSwitch brings the pods' new versions into force (versions.go):
// it follows policy-map-entries, cluster-policy-map-entries and
// policy-versions and, for each pod whose newest version of a tier is
// whole in the kernel (every row Done), makes it Active in the pod's
// policy-versions row, which the reconciler writes to
// enimasq_policy_versions; once that row is Done, the tier's deriver
// deletes the rows of the version that was in force before (under its
// flow control: cleanup in versions.go). A tier is switched only once its
// entries are initialized (every object compiled): until then the
// versions an earlier run left in force stay.
type versionSwitch struct {
	log      *slog.Logger
	db       *statedb.DB
	versions statedb.RWTable[*PodVersions]
	policy   statedb.RWTable[*PolicyMapEntry]
	cluster  statedb.RWTable[*ClusterMapEntry]
	pes      statedb.Table[*endpoints.PolicyEndpoint]
	cpes     statedb.Table[*endpoints.ClusterPolicyEndpoint]
	state    *policyVersions

	// failed holds, per pod, why a version cannot come into force.
	failed map[netip.Addr]string
	// edits are the rows of edits in place not in the kernel yet.
	edits pendingEdits
	// room is what the switch knows of new versions short of room
	// (room.go).
	room *roomState
}

// switchPart is how many pods the switch looks at in one transaction.
const switchPart = 256

// tierRow is a tier's row of a pod of a pod: version and status of each.
type tierRow struct {
	version uint32
	status  reconciler.Status
	what    string // map and peer, for messages
}

func (s *versionSwitch) rows(txn statedb.ReadTxn, tier policybpf.PolicyTier, pod netip.Addr) iter.Seq[tierRow] {
	if tier == policybpf.TierNetworkPolicy {
		return tierRows(txn, s.policy, pod)
	}
	return tierRows(txn, s.cluster, pod)
}

// tierRows are a pod's rows in a kind's table.
func tierRows[K entryKind](txn statedb.ReadTxn, table statedb.Table[*MapEntry[K]], pod netip.Addr) iter.Seq[tierRow] {
	return func(yield func(tierRow) bool) {
		for e := range table.Prefix(txn, podEntries[K](pod)) {
			if !yield(tierRow{e.Version, e.Status, e.Map() + " " + e.Peer().String()}) {
				return
			}
		}
	}
}

func (s *versionSwitch) run(ctx context.Context, health cell.Health) error {
	if !s.state.wait(ctx) { // the restored versions are in the table
		return nil
	}
	wtxn := s.db.WriteTxn(s.versions, s.policy, s.cluster)
	versionChanges, err1 := s.versions.Changes(wtxn)
	policyChanges, err2 := s.policy.Changes(wtxn)
	clusterChanges, err3 := s.cluster.Changes(wtxn)
	wtxn.Commit()
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("watch the policy versions: %w", err)
	}
	s.failed = map[netip.Addr]string{}
	s.edits = pendingEdits{}
	s.room = newRoomState()
	var roomTimer <-chan time.Time
	var initialized [len(tiers)]bool
	for {
		txn := s.db.ReadTxn()
		dirty := map[netip.Addr]struct{}{}
		vb, vw := versionChanges.Next(txn)
		for c := range vb {
			dirty[c.Object.Pod] = struct{}{}
		}
		pb, pw := policyChanges.Next(txn)
		for c := range pb {
			dirty[c.Object.Pod] = struct{}{}
			s.edits.note(txn, s.versions, policybpf.TierNetworkPolicy, c.Object.Pod, c.Object.Key(), c.Object.Status, c.Deleted)
		}
		cb, cw := clusterChanges.Next(txn)
		for c := range cb {
			dirty[c.Object.Pod] = struct{}{}
			s.edits.note(txn, s.versions, policybpf.TierCluster, c.Object.Pod, c.Object.Key(), c.Object.Status, c.Deleted)
		}
		var initWatch []<-chan struct{}
		for i, t := range []statedb.TableMeta{s.policy, s.cluster} {
			if initialized[i] {
				continue
			}
			ok, ch := t.Initialized(txn)
			if !ok {
				initWatch = append(initWatch, ch)
				continue
			}
			initialized[i] = true
			for v := range s.versions.All(txn) { // every pod may switch now
				dirty[v.Pod] = struct{}{}
			}
		}
		if len(dirty) > 0 {
			// In parts: the reconcilers write their rows' statuses in
			// these tables, and wait while a part is worked.
			pods := sortedAddrs(dirty)
			for len(pods) > 0 {
				n := min(len(pods), switchPart)
				s.work(txn, pods[:n], initialized)
				pods = pods[n:]
			}
		}
		if len(dirty) > 0 || roomTimer != nil {
			roomTimer = nil
			if again := s.balance(time.Now()); !again.IsZero() {
				roomTimer = time.After(time.Until(again))
			}
		}
		if len(dirty) > 0 {
			s.report(health)
		}
		var init0, init1 <-chan struct{}
		if len(initWatch) > 0 {
			init0 = initWatch[0]
		}
		if len(initWatch) > 1 {
			init1 = initWatch[1]
		}
		select {
		case <-vw:
		case <-pw:
		case <-cw:
		case <-init0:
		case <-init1:
		case <-roomTimer:
			roomTimer = closedTimer // balanced in the next round
		case <-ctx.Done():
			return nil
		}
	}
}

// closedTimer is a timer channel that has fired: the switch balances the
// room in its next round.
var closedTimer = func() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()

// work looks at the pods: cleans up after a switch that is in the kernel,
// and switches the tiers whose newest version is whole. seen is the
// snapshot the changes were read from (and s.edits noted): a pod whose
// versions row changed since is looked at with the next changes.
func (s *versionSwitch) work(seen statedb.ReadTxn, pods []netip.Addr, initialized [len(tiers)]bool) {
	wtxn := s.db.WriteTxn(s.versions, s.policy, s.cluster)
	defer wtxn.Commit()
	// Rows are listed in a snapshot (listing in a write transaction
	// freezes the tree): wtxn holds the tables' locks, so it is current.
	txn := s.db.ReadTxn()
	for _, pod := range pods {
		row, _, ok := s.versions.Get(wtxn, PodVersionsIndex.Query(pod))
		if !ok {
			delete(s.failed, pod)
			continue
		}
		if k := row.Status.Kind; k != reconciler.StatusKindDone && k != reconciler.StatusKindRefreshing {
			continue // the kernel may hold either version: wait
		}
		if was, _, _ := s.versions.Get(seen, PodVersionsIndex.Query(pod)); was != row {
			continue // changed since the edits were noted: dirty in the next changes
		}
		next := row.Clone()
		var written [len(tiers)]written
		for i, tier := range tiers {
			tv := next.Tiers[i]
			if !initialized[i] {
				continue
			}
			if tv.Want != tv.Active {
				written[i].whole, written[i].failure = s.whole(txn, tier, pod, tv.Want, tv.Rows)
			}
			written[i].edit, written[i].editFailure = s.edits.whole(tier, pod, tv.Active)
		}
		switched, failures := switchTiers(&next.Tiers, initialized, written)
		for i := range tiers {
			if initialized[i] {
				s.room.note(i, pod, next.Tiers[i])
			}
		}
		if len(failures) > 0 {
			s.failed[pod] = fmt.Sprintf("pod %s (%s): %s", pod, s.objects(txn, pod), strings.Join(failures, "; "))
		} else {
			delete(s.failed, pod)
		}
		switch {
		case switched:
			s.versions.Insert(wtxn, next.SetStatus(reconciler.StatusPending()))
		case *next != *row:
			s.versions.Insert(wtxn, next)
		}
	}
}

// whole says whether a tier's version v of a pod is in the kernel whole
// (its rows, every one Done), or else why it cannot be (a row the kernel
// refused), if so.
func (s *versionSwitch) whole(txn statedb.ReadTxn, tier policybpf.PolicyTier, pod netip.Addr, v uint32, rows int) (bool, string) {
	if v == policybpf.PolicyVersionNone {
		return true, ""
	}
	done, failure := 0, ""
	for r := range s.rows(txn, tier, pod) {
		if r.version != v {
			continue
		}
		switch r.status.Kind {
		case reconciler.StatusKindDone, reconciler.StatusKindRefreshing:
			done++
		case reconciler.StatusKindError:
			if failure == "" {
				failure = r.what + ": " + r.status.GetError()
			}
		}
	}
	return done == rows, failure
}

// written is how far a tier's version on the way is in the kernel (whole:
// every row Done; or why it cannot be: a row the kernel refused), and how
// far the version in force is (edit: no row of it Pending or refused; or
// editFailure, why not).
type written struct {
	whole       bool
	failure     string
	edit        bool
	editFailure string
}

// switchTiers brings a pod's new versions into force (tvs, its tiers'
// versions, as the switch found them written) and returns whether the
// kernel's entry changes, and why versions cannot come into force.
//
// A tier is Editing while a row of its version in force is not in the
// kernel (an edit in place being written, or refused: edit.go). A pod's
// tiers switch together: a tier whose new version is whole waits while
// the other tier is busy, its new version or its edit still being written
// (not failed), so that no packet meets one tier's new policy with the
// other's old one or half-edited one. A version that fails never comes
// into force: the pod keeps the one it has or, with none, is closed.
func switchTiers(tvs *[len(tiers)]TierVersions, initialized [len(tiers)]bool, w [len(tiers)]written) (switched bool, failures []string) {
	var busy [len(tiers)]bool
	for i := range tiers {
		tv := &tvs[i]
		if !initialized[i] {
			tv.Failed = ""
			continue
		}
		tv.Editing = !w[i].edit
		busy[i] = tv.Want != tv.Active && !w[i].whole && w[i].failure == "" || tv.Editing && w[i].editFailure == ""
	}
	for i := range tiers {
		tv := &tvs[i]
		if !initialized[i] {
			continue
		}
		othersBusy := false
		for j := range tiers {
			othersBusy = othersBusy || j != i && busy[j]
		}
		switch {
		case tv.Want != tv.Active && w[i].whole && !othersBusy:
			tv.Prev, tv.Active, tv.Failed = tv.Active, tv.Want, ""
			tv.Editing = false // the edited version is replaced
			switched = true
		case tv.Want != tv.Active && w[i].failure != "":
			tv.Failed = w[i].failure
			failures = append(failures, fmt.Sprintf("%s version %s not written, %s: %s", tierNames[i],
				versionText(tv.Want), keeps(tv.Active), w[i].failure))
			if tv.Active == policybpf.PolicyVersionNone {
				tv.Active = policybpf.PolicyVersionClosed // none to keep: fail closed
				switched = true
			}
		case tv.Want != tv.Active:
			// Being written, or waiting for the other tier: what failed
			// stays said until it is written.
		case tv.Waiting:
			// Taken back for want of room (room.go): said until the
			// switch lets it be written again.
			failures = append(failures, tierNames[i]+" "+tv.Failed)
		case tv.Editing && w[i].editFailure != "":
			tv.Failed = w[i].editFailure
			failures = append(failures, fmt.Sprintf("%s version %s not edited whole, the pod is between the policy before and after the edit: %s",
				tierNames[i], versionText(tv.Active), tv.Failed))
		default:
			tv.Failed = ""
		}
	}
	return switched, failures
}

func keeps(active uint32) string {
	switch active {
	case policybpf.PolicyVersionNone:
		return "the pod is closed (it had none)"
	case policybpf.PolicyVersionClosed:
		return "the pod stays closed"
	}
	return "the pod keeps version " + versionText(active)
}

// objects names the objects that select a pod.
func (s *versionSwitch) objects(txn statedb.ReadTxn, pod netip.Addr) string {
	var out []string
	for pe := range s.pes.List(txn, endpoints.PolicyEndpointPodIndex.Query(pod)) {
		out = append(out, pe.Key())
	}
	for cpe := range s.cpes.List(txn, endpoints.ClusterPolicyEndpointPodIndex.Query(pod)) {
		out = append(out, "cluster "+cpe.Key())
	}
	if len(out) == 0 {
		return "no object"
	}
	return strings.Join(out, ", ")
}

// report sets health: Degraded, naming a few pods, their objects and the
// reasons, while a version cannot come into force.
func (s *versionSwitch) report(health cell.Health) {
	if len(s.failed) == 0 {
		health.OK("Every pod's newest policy in force or being written")
		return
	}
	msgs := make([]string, 0, len(s.failed))
	for _, m := range s.failed {
		msgs = append(msgs, m)
	}
	slices.SortFunc(msgs, cmp.Compare)
	health.Degraded(fmt.Sprintf("%d pods' policy changes cannot be written whole", len(msgs)),
		errors.New(strings.Join(msgs[:min(len(msgs), 3)], "; ")))
}

// pendingEdits are, per pod and tier, the rows of its version in force
// that the kernel does not hold (yet), with the kernel's error if it
// refused one: an edit in place being written, or a row the refresh
// could not write back. The switch notes them from the changes of the
// entries tables, so that it knows the version in force whole without
// reading the pod's other rows (the deriver writes an edit in one
// transaction, with its Editing).
type pendingEdits map[tierPod]map[PolicyEntryKey]string

// note takes a change of a row of a pod's tier, in txn.
func (e pendingEdits) note(txn statedb.ReadTxn, versions statedb.Table[*PodVersions], tier policybpf.PolicyTier, pod netip.Addr, key PolicyEntryKey, status reconciler.Status, deleted bool) {
	tp := tierPod{tier, pod}
	if deleted || inKernel(status) {
		if rows := e[tp]; rows != nil {
			delete(rows, key)
			if len(rows) == 0 {
				delete(e, tp)
			}
		}
		return
	}
	row, _, ok := versions.Get(txn, PodVersionsIndex.Query(pod))
	if !ok || row.Tiers[tier].Active != key.Version {
		return // a new version's row: counted whole (versionSwitch.whole)
	}
	if e[tp] == nil {
		e[tp] = map[PolicyEntryKey]string{}
	}
	e[tp][key] = status.GetError()
}

// whole says whether the edit of a pod's tier at version v is in the
// kernel, or why a row of it cannot be.
func (e pendingEdits) whole(tier policybpf.PolicyTier, pod netip.Addr, v uint32) (bool, string) {
	pending, failure, first := false, "", ""
	for k, err := range e[tierPod{tier, pod}] {
		if k.Version != v {
			continue
		}
		pending = true
		if what := k.Map + " " + k.Peer.String(); err != "" && (first == "" || what < first) {
			first, failure = what, what+": "+err // the first refused, in key order
		}
	}
	return !pending, failure
}
