package compile

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/statedb"
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
// every pod whose new version fits beside the others' in force converges,
// one after the other if need be. One that does not fit even alone keeps
// its version in force (the module Degraded, naming it) and does not hold
// the others: after roomTurn alone it is passed over (tried) and the
// waiting ones are let go.
//
// Only a pod with a version in force is taken back: a pod without one is
// closed (fail closed) until its first version is whole.

// roomTurn is how long a new version short of room is the only one
// written before the waiting ones get their turn again.
const roomTurn = 2 * time.Second

// noRoom are the texts of the kernel's errors for a full map: an LPM trie
// says ENOSPC, a hash without preallocation (a chunk map) E2BIG.
var noRoom = []string{unix.ENOSPC.Error(), unix.E2BIG.Error()}

func isNoRoom(failed string) bool {
	for _, t := range noRoom {
		if strings.Contains(failed, t) {
			return true
		}
	}
	return false
}

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
	if tv.Want != tv.Active && active && isNoRoom(tv.Failed) {
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
func planRoom(short map[netip.Addr]uint32, waiting, tried map[netip.Addr]bool, aloneTooLong bool) (park, unpark []netip.Addr, passed netip.Addr) {
	switch {
	case len(short) == 0:
		unpark = sortedKeys(waiting)
	case len(short) == 1:
		if aloneTooLong && len(waiting) > 0 {
			for pod := range short {
				passed = pod
			}
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
	return park, unpark, passed
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
	var plans [len(tiers)]struct{ park, unpark []netip.Addr }
	any := false
	for i := range tiers {
		// Alone: one version short of room while others wait for it.
		if len(r.short[i]) == 1 && len(r.waiting[i]) > 0 {
			if r.alone[i].IsZero() {
				r.alone[i] = now
			}
		} else {
			r.alone[i] = time.Time{}
		}
		if len(r.short[i]) == 0 {
			clear(r.tried[i])
		}
		park, unpark, passed := planRoom(r.short[i], r.waiting[i], r.tried[i], !r.alone[i].IsZero() && now.Sub(r.alone[i]) >= roomTurn)
		if passed.IsValid() {
			r.tried[i][passed] = true
			r.alone[i] = time.Time{}
		}
		plans[i].park, plans[i].unpark = park, unpark
		any = any || len(park) > 0 || len(unpark) > 0
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
		// The one kept: short of room, not taken back.
		var oldest netip.Addr
		for pod := range r.short[i] {
			if !slices.Contains(plans[i].park, pod) {
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
	// Handed to the derivers before the commit, which wakes them: a
	// deriver that takes them early reads their rows in its own write
	// transaction, which waits for this one.
	for i, tier := range tiers {
		if len(released[i]) > 0 {
			s.state.release(tier, released[i]...)
		}
	}
	wtxn.Commit()
	return again
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
