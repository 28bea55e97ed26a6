package compile

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// Room in the maps for new versions.
//
// A pod's new version is written whole beside the version in force
// (versions.go), so a change that gives many pods new versions at once
// needs room for all of them. When the maps cannot hold them, each pod's
// new version gets some of its keys in before the map is full, none is
// whole, none comes into force, and none ever frees the room of its old
// version: every pod keeps its old policy, and a later change (a
// revocation) never applies. So when new versions of two or more pods of a
// tier are refused for want of room (ENOSPC), the switch keeps the oldest
// (the smallest version number: the change that came first) and takes the
// others back: their keys go, they are Waiting (their pods keep the
// version in force, which is whole), and the deriver writes them again
// once no new version of the tier is short of room. Each round brings at
// least the oldest one into force, which frees its old version's room:
// every pod whose new version fits beside the others' in force converges.
// One that has been short of room alone for roomTurn either fits in place
// of its version in force (in every map, its refused keys are no more
// than the keys in force): the pod is then closed (every packet denied,
// as a pod whose first version is not whole), its old version's keys go,
// and the new version takes their room and comes into force; so at any
// pressure every change applies, through a closed moment at worst. Or it
// does not fit even so: it keeps its version in force (the module
// Degraded, naming it), and does not hold the others, which are let go
// (it is passed over: tried).
//
// Only a pod with a version in force is taken back: a pod without one is
// closed (fail closed) until its first version is whole.

// roomTurn is how long a new version short of room is the only one
// written before the waiting ones get their turn again.
const roomTurn = 2 * time.Second

// noRoom is the text of the kernel's error for a full map.
var noRoom = unix.ENOSPC.Error()

// roomState is what the switch knows of the tiers' new versions short of
// room.
type roomState struct {
	// short are, per tier, the pods whose new version a full map refused,
	// with that version.
	short [len(tiers)]map[netip.Addr]uint32
	// waiting are the pods taken back, tried those passed over (a new
	// version that did not fit alone), alone since when a tier's one new
	// version short of room was alone with pods waiting.
	waiting [len(tiers)]map[netip.Addr]bool
	tried   [len(tiers)]map[netip.Addr]bool
	alone   [len(tiers)]time.Time
}

func newRoomState() *roomState {
	r := &roomState{}
	for i := range tiers {
		r.short[i] = map[netip.Addr]uint32{}
		r.waiting[i] = map[netip.Addr]bool{}
		r.tried[i] = map[netip.Addr]bool{}
	}
	return r
}

// note records a pod's tier as the switch left it.
func (r *roomState) note(i int, pod netip.Addr, tv TierVersions) {
	active := tv.Active != policybpf.PolicyVersionNone && tv.Active != policybpf.PolicyVersionClosed
	if tv.Want != tv.Active && active && strings.Contains(tv.Failed, noRoom) {
		r.short[i][pod] = tv.Want
	} else {
		delete(r.short[i], pod)
	}
	if !tv.Waiting {
		delete(r.waiting[i], pod)
	}
}

// planRoom decides, for one tier, which pods' new versions are taken back
// (park) and which waiting ones may be written again (unpark): short are
// the pods whose new version (the value) a full map refused, waiting
// those taken back before, tried those passed over; aloneTooLong says that
// one new version has been short of room alone for roomTurn. passed is the
// pod passed over now, if any.
func planRoom(short map[netip.Addr]uint32, waiting, tried map[netip.Addr]bool, aloneTooLong, closable bool) (park, unpark []netip.Addr, passed, closeThrough netip.Addr) {
	switch {
	case len(short) == 0:
		unpark = sortedKeys(waiting)
	case len(short) == 1:
		var pod netip.Addr
		for p := range short {
			pod = p
		}
		switch {
		case !aloneTooLong:
		case closable:
			closeThrough = pod
		case len(waiting) > 0:
			passed = pod
			unpark = sortedKeys(waiting)
		}
	default:
		pods := make([]netip.Addr, 0, len(short))
		for pod := range short {
			pods = append(pods, pod)
		}
		slices.SortFunc(pods, func(a, b netip.Addr) int {
			if c := cmp.Compare(short[a], short[b]); c != 0 {
				return c
			}
			return a.Compare(b)
		})
		keep := -1
		for i, pod := range pods {
			if !tried[pod] {
				keep = i
				break
			}
		}
		if keep < 0 {
			keep = 0 // every one passed over once: the oldest again
		}
		for i, pod := range pods {
			if i != keep {
				park = append(park, pod)
			}
		}
	}
	return park, unpark, passed, closeThrough
}

func sortedKeys(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// balance plans every tier and applies the plan: a pod taken back loses
// its new version's rows and is Waiting; a waiting pod let go is Waiting
// no more, and its deriver writes its new version again. It returns when
// to look again (zero: only on changes).
func (s *versionSwitch) balance(now time.Time) (again time.Time) {
	r := s.room
	var plans [len(tiers)]struct {
		park, unpark []netip.Addr
		close        netip.Addr
	}
	any := false
	txn := s.db.ReadTxn()
	for i, tier := range tiers {
		closable := false
		if len(r.short[i]) == 1 {
			if r.alone[i].IsZero() {
				r.alone[i] = now
			}
			for pod, v := range r.short[i] {
				closable = s.fitsIfClosed(txn, tier, pod, v)
			}
		} else {
			r.alone[i] = time.Time{}
		}
		if len(r.short[i]) == 0 {
			clear(r.tried[i])
		}
		park, unpark, passed, closeThrough := planRoom(r.short[i], r.waiting[i], r.tried[i],
			!r.alone[i].IsZero() && now.Sub(r.alone[i]) >= roomTurn, closable)
		if passed.IsValid() {
			r.tried[i][passed] = true
		}
		if passed.IsValid() || closeThrough.IsValid() {
			r.alone[i] = time.Time{}
		}
		plans[i].park, plans[i].unpark, plans[i].close = park, unpark, closeThrough
		any = any || len(park) > 0 || len(unpark) > 0 || closeThrough.IsValid()
		if !r.alone[i].IsZero() {
			if t := r.alone[i].Add(roomTurn); again.IsZero() || t.Before(again) {
				again = t
			}
		}
	}
	if !any {
		return again
	}
	wtxn := s.db.WriteTxn(s.versions, s.policy, s.cluster)
	var released [len(tiers)][]netip.Addr
	for i, tier := range tiers {
		var oldest netip.Addr
		for pod, v := range r.short[i] {
			if !oldest.IsValid() || v < r.short[i][oldest] {
				oldest = pod
			}
		}
		for _, pod := range plans[i].park {
			row, _, ok := s.versions.Get(wtxn, PodVersionsIndex.Query(pod))
			if !ok {
				continue
			}
			next := row.Clone()
			tv := &next.Tiers[i]
			if tv.Want == tv.Active {
				continue
			}
			// Listed in a snapshot (listing in a write transaction
			// freezes the tree): wtxn holds the tables' locks.
			var active int
			if tier == policybpf.TierNetworkPolicy {
				active = dropVersion(s.db.ReadTxn(), wtxn, s.policy, pod, tv.Want, tv.Active)
			} else {
				active = dropVersion(s.db.ReadTxn(), wtxn, s.cluster, pod, tv.Want, tv.Active)
			}
			s.log.Info("Policy version taken back: the maps have no room for it beside an older one",
				"pod", pod, "tier", tierNames[i], "version", tv.Want, "first", oldest)
			tv.Failed = fmt.Sprintf("version %s waits for room in the maps (%s's new version is written first; %s)",
				versionText(tv.Want), oldest, strings.TrimSpace(tv.Failed))
			tv.Want, tv.Rows, tv.Waiting = tv.Active, active, true
			s.versions.Insert(wtxn, next)
			delete(r.short[i], pod)
			r.waiting[i][pod] = true
		}
		if pod := plans[i].close; pod.IsValid() {
			if row, _, ok := s.versions.Get(wtxn, PodVersionsIndex.Query(pod)); ok && row.Tiers[i].Want != row.Tiers[i].Active {
				next := row.Clone()
				tv := &next.Tiers[i]
				s.log.Warn("Pod closed while its new policy version is written: the maps have room for it only in place of the version in force",
					"pod", pod, "tier", tierNames[i], "version", tv.Want, "closed", tv.Active)
				tv.Prev, tv.Active = tv.Active, policybpf.PolicyVersionClosed
				tv.Failed = fmt.Sprintf("closed while version %s is written in place of %s (no room for both; %s)",
					versionText(tv.Want), versionText(tv.Prev), strings.TrimSpace(tv.Failed))
				s.versions.Insert(wtxn, next.SetStatus(reconciler.StatusPending()))
				delete(r.short[i], pod)
			}
		}
		for _, pod := range plans[i].unpark {
			delete(r.waiting[i], pod)
			row, _, ok := s.versions.Get(wtxn, PodVersionsIndex.Query(pod))
			if !ok || !row.Tiers[i].Waiting {
				continue
			}
			next := row.Clone()
			next.Tiers[i].Waiting, next.Tiers[i].Failed = false, ""
			s.versions.Insert(wtxn, next)
			released[i] = append(released[i], pod)
		}
	}
	wtxn.Commit()
	// Handed to the derivers once committed: they write the new versions
	// again from a snapshot where the pods wait no more (the change wakes
	// them).
	for i, tier := range tiers {
		if len(released[i]) > 0 {
			s.state.release(tier, released[i]...)
		}
	}
	return again
}

// fitsIfClosed says whether a pod's new version v of a tier, short of
// room, would fit once its version in force is gone: in every map, its
// rows the kernel refused are no more than the rows in force. Then the
// pod may be closed while v is written (nothing is more closed), and its
// old version's room goes to v.
func (s *versionSwitch) fitsIfClosed(txn statedb.ReadTxn, tier policybpf.PolicyTier, pod netip.Addr, v uint32) bool {
	row, _, ok := s.versions.Get(txn, PodVersionsIndex.Query(pod))
	if !ok {
		return false
	}
	active := row.Tiers[tier].Active
	refused, held := map[string]int{}, map[string]int{}
	for r := range s.rows(txn, tier, pod) {
		m, _, _ := strings.Cut(r.what, " ")
		switch {
		case r.version == v && r.status.Kind == reconciler.StatusKindError:
			refused[m]++
		case r.version == active:
			held[m]++
		}
	}
	for m, n := range refused {
		if n > held[m] {
			return false
		}
	}
	return len(refused) > 0
}

// dropVersion deletes a pod's rows of version v from a kind's table and
// returns how many rows it has of version active.
func dropVersion[K entryKind](txn statedb.ReadTxn, wtxn statedb.WriteTxn, table statedb.RWTable[*MapEntry[K]], pod netip.Addr, v, active uint32) int {
	var drop []*MapEntry[K]
	n := 0
	for e := range table.Prefix(txn, podEntries[K](pod)) {
		switch e.Version {
		case v:
			drop = append(drop, e)
		case active:
			n++
		}
	}
	for _, e := range drop {
		table.Delete(wtxn, e)
	}
	return n
}
