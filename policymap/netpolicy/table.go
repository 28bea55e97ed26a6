package netpolicy

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

// PolicyMapEntriesTableName is the table of network-policy map entries.
const PolicyMapEntriesTableName = "policy-map-entries"

// PolicyMapEntry is one entry of a network-policy map: what a pod may do
// with the peers in a prefix, in one direction. Objects in the table are
// immutable.
type PolicyMapEntry struct {
	Map  string // enimasq_egress_v4, ...
	Pod  netip.Addr
	Peer netip.Prefix
	// Ports is the value as text: "deny", "any", or "tcp/80,udp/53".
	Ports string
	// Error is set when the rules cannot be encoded for this key (more than
	// 24 port entries): the key then denies (fails closed).
	Error  string `json:",omitempty"`
	Status reconciler.Status

	key, value []byte // kernel bytes, encoded once; value may be shared
}

func (e *PolicyMapEntry) MapName() string  { return e.Map }
func (e *PolicyMapEntry) MapKey() []byte   { return e.key }
func (e *PolicyMapEntry) MapValue() []byte { return e.value }

func (e *PolicyMapEntry) Clone() *PolicyMapEntry { c := *e; return &c }

func (e *PolicyMapEntry) GetStatus() reconciler.Status { return e.Status }

func (e *PolicyMapEntry) SetStatus(s reconciler.Status) *PolicyMapEntry {
	e.Status = s
	return e
}

// sameDesired reports whether two entries ask for the same kernel state
// (statuses aside).
func (e *PolicyMapEntry) sameDesired(o *PolicyMapEntry) bool {
	return e.Map == o.Map && e.Error == o.Error &&
		bytes.Equal(e.key, o.key) && bytes.Equal(e.value, o.value)
}

func (e *PolicyMapEntry) TableHeader() []string {
	return []string{"Map", "Pod", "Peer", "Ports", "Status", "Error"}
}

func (e *PolicyMapEntry) TableRow() []string {
	var errs []string
	if e.Error != "" {
		errs = append(errs, e.Error)
	}
	if msg := e.Status.GetError(); msg != "" {
		errs = append(errs, msg)
	}
	return []string{e.Map, e.Pod.String(), e.Peer.String(), e.Ports, e.Status.Kind.String(), strings.Join(errs, "; ")}
}

// policyEntryID is the primary key: map name, pod and peer prefix, in
// bytes that sort by map, then pod, then peer.
func policyEntryID(mapName string, pod netip.Addr, peer netip.Prefix) index.Key {
	b := make([]byte, 0, len(mapName)+1+16+16+1)
	b = append(append(b, mapName...), 0)
	b = append(b, pod.AsSlice()...)
	b = append(b, peer.Addr().AsSlice()...)
	return append(b, byte(peer.Bits()))
}

// PolicyEntryKey is the primary key of a policy-map entry.
type PolicyEntryKey struct {
	Map  string
	Pod  netip.Addr
	Peer netip.Prefix
}

func (e *PolicyMapEntry) Key() PolicyEntryKey { return PolicyEntryKey{e.Map, e.Pod, e.Peer} }

var (
	// PolicyEntryIndex is the primary index: map, pod, peer. As a string
	// query: "map pod peer" ("enimasq_egress_v4 10.0.0.5 10.0.0.0/8").
	PolicyEntryIndex = statedb.Index[*PolicyMapEntry, PolicyEntryKey]{
		Name: "id",
		FromObject: func(e *PolicyMapEntry) index.KeySet {
			return index.NewKeySet(policyEntryID(e.Map, e.Pod, e.Peer))
		},
		FromKey: func(k PolicyEntryKey) index.Key {
			return policyEntryID(k.Map, k.Pod, k.Peer)
		},
		FromString: func(s string) (index.Key, error) {
			f := strings.Fields(s)
			if len(f) != 3 {
				return nil, fmt.Errorf("%q: want \"map pod peer\"", s)
			}
			pod, err := netip.ParseAddr(f[1])
			if err != nil {
				return nil, err
			}
			peer, err := netip.ParsePrefix(f[2])
			if err != nil {
				return nil, err
			}
			return policyEntryID(f[0], pod, peer.Masked()), nil
		},
		Unique: true,
	}

	// PolicyEntryPodIndex finds the entries of a pod IP, in every map.
	PolicyEntryPodIndex = statedb.Index[*PolicyMapEntry, netip.Addr]{
		Name: "pod",
		FromObject: func(e *PolicyMapEntry) index.KeySet {
			return index.NewKeySet(index.NetIPAddr(e.Pod))
		},
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
		Unique:     false,
	}
)

// NewPolicyMapEntriesTable creates and registers policy-map-entries.
func NewPolicyMapEntriesTable(db *statedb.DB) (statedb.RWTable[*PolicyMapEntry], error) {
	return statedb.NewTable(db, PolicyMapEntriesTableName, PolicyEntryIndex, PolicyEntryPodIndex)
}
