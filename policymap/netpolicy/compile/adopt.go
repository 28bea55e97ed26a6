package compile

import (
	"fmt"
	"net/netip"

	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
)

// Adoption: a restart writes what changed, not every pod's policy again.
//
// An agent that starts finds the versions an earlier run left in force
// (policyVersions.restore) and their keys in the maps; its tables are
// empty. Compiled anew, every pod would get a new version, written whole
// beside the old one (twice the keys for a moment, every key written). So
// at start the keys of the versions in force are read from the maps once
// (readAdoptable), and the deriver compares a restored pod's compiled
// entries with them (adopt): where the kernel holds the same bytes, the
// row is taken over at that version as it is, Done, without a map
// operation; where it differs by entries to write, the difference is an
// edit of the version in force, taken only if it is safe in place
// (edit.go), and otherwise the pod gets a new version as for any change;
// the kernel's keys no entry desires are taken over as rows too, which
// the pod's next compile, queued at once, deletes as an edit. The prune keeps a
// version's keys only while the run has not taken the version over
// (policyVersions.keep), judged in the snapshot it prunes against.
// An entry whose value has chunks is written again (same bytes): that the
// earlier run's chunks are all still there is not read.

// tierPod is a pod's tier.
type tierPod struct {
	tier policybpf.PolicyTier
	pod  netip.Addr
}

// adoptable are the kernel's entries of the versions in force that an
// earlier run left, by tier and pod: per entry key (version 0), the value.
type adoptable map[tierPod]map[PolicyEntryKey]string

// readAdoptable reads, from each tier's maps (open, by name), the entries
// of the versions in force (restored: per pod, per tier).
func readAdoptable(restored map[netip.Addr][2]uint32, kernel [len(tiers)]map[string]bpf.PinnedMap, names [len(tiers)][]string) (adoptable, int, error) {
	out := adoptable{}
	n := 0
	for i, tier := range tiers {
		for _, name := range names[i] {
			m := kernel[i][name]
			if m == nil {
				continue
			}
			f := bpf.IPv4
			if m.KeySize() == bpf.PolicyKeySizeV6 {
				f = bpf.IPv6
			}
			entries, err := bpf.Entries(m)
			if err != nil {
				return nil, 0, fmt.Errorf("%s: %w", name, err)
			}
			for _, kv := range entries {
				pod, version, peer, err := bpf.UnmarshalPolicyKeyVersion(f, kv.Key)
				if err != nil {
					continue
				}
				if vs, ok := restored[pod]; !ok || vs[i] != version || version == policybpf.PolicyVersionNone || version == policybpf.PolicyVersionClosed {
					continue // not in force: the prune's
				}
				tp := tierPod{tier, pod}
				if out[tp] == nil {
					out[tp] = map[PolicyEntryKey]string{}
				}
				out[tp][PolicyEntryKey{Map: name, Pod: pod, Peer: peer}] = string(kv.Value)
				n++
			}
		}
	}
	return out, n, nil
}

// restored says whether a pod's tier is at a version an earlier run left
// (in force, no rows of this run: Want none) and the kernel has it (done).
func restored(tv TierVersions, done bool) bool {
	return done && tv.Want == policybpf.PolicyVersionNone && tv.Prev == policybpf.PolicyVersionNone &&
		tv.Active != policybpf.PolicyVersionNone && tv.Active != policybpf.PolicyVersionClosed
}

// adopt returns the rows that take over the kernel's entries of version v
// for a pod's desired entries, all at v: Done where the kernel holds the
// same bytes (and the value has no chunks), Pending otherwise; and, Done,
// the extra keys the kernel holds that no entry desires. ok is false when
// the rows to write are an edit that is not allowed (edit) or not safe in
// place (nested): the pod then gets a new version. With every key on each
// peer's chain as it was but at most one rewritten, the taken-over state
// (desired and extra keys) decides each peer as before or as desired; the
// next compile deletes the extra keys as an edit of its own.
func adopt[K entryKind](kernel map[PolicyEntryKey]string, desired []*MapEntry[K], v uint32, edit bool) (rows []*MapEntry[K], extra int, ok bool) {
	touched := map[string][]netip.Prefix{}
	seen := make(map[PolicyEntryKey]bool, len(desired))
	rows = make([]*MapEntry[K], len(desired))
	for i, d := range desired {
		k := d.Key()
		seen[k] = true
		r := d.atVersion(v) // Pending
		val, had := kernel[k]
		switch {
		case !had || val != string(d.MapValue()):
			touched[k.Map] = append(touched[k.Map], k.Peer)
		case len(d.Spill()) == 0:
			r.Status = reconciler.StatusDone() // the kernel holds it
		}
		rows[i] = r
	}
	for k := range kernel {
		if !seen[k] { // deleted by the pod's next compile: touched alike
			touched[k.Map] = append(touched[k.Map], k.Peer)
		}
	}
	if len(touched) > 0 && !edit {
		return nil, 0, false
	}
	for _, ps := range touched {
		if nested(ps) {
			return nil, 0, false
		}
	}
	// The kernel's keys no entry desires are taken over too, as rows as
	// they are (Done), for the next compile of the pod to delete as an
	// edit, or with its version if that is not safe.
	for k, val := range kernel {
		if !seen[k] {
			e := &MapEntry[K]{Pod: k.Pod, Version: v, Status: reconciler.StatusDone(),
				t: &templateEntry{mapName: k.Map, peer: k.Peer, value: &portValue{bytes: []byte(val), text: "(an earlier run's, to delete)"}}}
			rows = append(rows, e)
			extra++
		}
	}
	return rows, extra, true
}

// adopted reports how many rows a pod's adoption takes over as they are.
func adopted[K entryKind](rows []*MapEntry[K]) int {
	n := 0
	for _, r := range rows {
		if r.Status.Kind == reconciler.StatusKindDone {
			n++
		}
	}
	return n
}
