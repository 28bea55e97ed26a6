package compile

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
)

// PolicyMapEntriesTableName is the table of network-policy map entries.
const PolicyMapEntriesTableName = "policy-map-entries"

// portValue is a compiled map value: its kernel bytes, its chunks (the
// intervals past the value's, in enimasq_policy_chunks), its text and, when
// it could not be encoded, why it denies. Immutable and shared by every
// entry with the same value.
type portValue struct {
	bytes  []byte
	chunks []bpf.SpillEntry
	text   string
	err    string
}

// templateEntry is an entry of a compiled template (template.go): the
// map, peer and value that the rows stamped from it share.
type templateEntry struct {
	mapName string
	peer    netip.Prefix
	value   *portValue
}

// PolicyMapEntry is one entry of a network-policy map: what a pod may do
// with the peers in a prefix, in one direction. Objects in the table are
// immutable.
//
// A row is small (80 bytes) because a node may hold hundreds of thousands:
// the map, peer, value and its text are those of a compiled template entry,
// shared by every pod of the selection it was compiled for; the kernel key
// is encoded when the reconciler asks for it. It prints, and marshals to
// JSON and YAML, as the fields Map, Pod, Peer, Ports, Error and Status.
type PolicyMapEntry struct {
	Pod netip.Addr
	// Version is the version of the pod's policy the entry belongs to
	// (versions.go): the programs look the pod's keys up at the version
	// in force.
	Version uint32
	Status  reconciler.Status
	t       *templateEntry
}

func (e *PolicyMapEntry) MapName() string  { return e.t.mapName }
func (e *PolicyMapEntry) MapValue() []byte { return e.t.value.bytes }

// SpillMap and Spill are the value's chunks (bpf.Spiller), written before
// the entry.
func (e *PolicyMapEntry) SpillMap() string {
	if len(e.t.value.chunks) == 0 {
		return ""
	}
	return bpf.PolicyChunksMapName
}
func (e *PolicyMapEntry) Spill() []bpf.SpillEntry { return e.t.value.chunks }

// MapKey encodes the kernel key: pod and peer are of one family by
// construction (a template is compiled for the family of its pods), so it
// does not fail; if it ever did, the nil key fails the operation and the
// entry shows the error.
func (e *PolicyMapEntry) MapKey() []byte {
	k, err := bpf.AppendPolicyKeyVersion(make([]byte, 0, 8+2*e.Pod.BitLen()/8), e.Pod, e.Version, e.t.peer)
	if err != nil {
		return nil
	}
	return k
}

// Map is the policy map: enimasq_egress_v4, ...
func (e *PolicyMapEntry) Map() string { return e.t.mapName }

// Peer is the peer prefix of the key.
func (e *PolicyMapEntry) Peer() netip.Prefix { return e.t.peer }

// Ports is the value as text: "deny", "any", or "tcp/80,udp/53".
func (e *PolicyMapEntry) Ports() string { return e.t.value.text }

// EncodeError is set when the value cannot be encoded (never for a
// compiled value): the key then denies (fails closed).
func (e *PolicyMapEntry) EncodeError() string { return e.t.value.err }

func (e *PolicyMapEntry) Clone() *PolicyMapEntry { c := *e; return &c }

func (e *PolicyMapEntry) GetStatus() reconciler.Status { return e.Status }

func (e *PolicyMapEntry) SetStatus(s reconciler.Status) *PolicyMapEntry {
	e.Status = s
	return e
}

// sameDesired reports whether two entries ask for the same kernel state
// (statuses and versions aside).
func (e *PolicyMapEntry) sameDesired(o *PolicyMapEntry) bool {
	if e.Pod != o.Pod {
		return false
	}
	a, b := e.t, o.t
	return a == b || a.mapName == b.mapName && a.peer == b.peer &&
		(a.value == b.value || a.value.err == b.value.err && bytes.Equal(a.value.bytes, b.value.bytes))
}

func (e *PolicyMapEntry) TableHeader() []string {
	return []string{"Map", "Pod", "Peer", "Ports", "Status", "Error", "Version"}
}

func (e *PolicyMapEntry) TableRow() []string {
	var errs []string
	if msg := e.EncodeError(); msg != "" {
		errs = append(errs, msg)
	}
	if msg := e.Status.GetError(); msg != "" {
		errs = append(errs, msg)
	}
	return []string{e.Map(), e.Pod.String(), e.Peer().String(), e.Ports(), e.Status.Kind.String(), strings.Join(errs, "; "),
		strconv.FormatUint(uint64(e.Version), 10)}
}

// policyMapEntryView is how an entry marshals (statedb dump, db/show
// --format=json|yaml).
type policyMapEntryView struct {
	Map     string            `json:"Map" yaml:"map"`
	Pod     netip.Addr        `json:"Pod" yaml:"pod"`
	Version uint32            `json:"Version" yaml:"version"`
	Peer    netip.Prefix      `json:"Peer" yaml:"peer"`
	Ports   string            `json:"Ports" yaml:"ports"`
	Error   string            `json:"Error,omitempty" yaml:"error,omitempty"`
	Status  reconciler.Status `json:"Status" yaml:"status"`
}

func (e *PolicyMapEntry) view() policyMapEntryView {
	return policyMapEntryView{Map: e.Map(), Pod: e.Pod, Version: e.Version, Peer: e.Peer(), Ports: e.Ports(), Error: e.EncodeError(), Status: e.Status}
}

func (e *PolicyMapEntry) MarshalJSON() ([]byte, error) { return json.Marshal(e.view()) }

func (e *PolicyMapEntry) MarshalYAML() (any, error) { return e.view(), nil }

// PolicyEntryKey is the primary key of a policy-map entry.
type PolicyEntryKey struct {
	Map     string
	Pod     netip.Addr
	Peer    netip.Prefix
	Version uint32
}

func (e *PolicyMapEntry) Key() PolicyEntryKey {
	return PolicyEntryKey{e.Map(), e.Pod, e.Peer(), e.Version}
}

// policyEntryID is the primary key, in bytes that sort by pod (IPv4
// first), then map, then peer, then version: the pod's address length,
// the pod, the map's position in bpf.PolicyMapNames (plus one; 0 for a
// name that is not a policy map), the peer and its length, the version
// (big endian). A pod's entries are the ones under podEntriesPrefix. 15
// bytes for IPv4.
func policyEntryID(mapName string, pod netip.Addr, peer netip.Prefix, version uint32) index.Key {
	return mapEntryID(bpf.PolicyMapNames, mapName, pod, peer, version)
}

// mapEntryID is the key of an entry of one of the maps names, by the map's
// position in names.
func mapEntryID(names []string, mapName string, pod netip.Addr, peer netip.Prefix, version uint32) index.Key {
	b := make([]byte, 0, 1+pod.BitLen()/8+1+peer.Addr().BitLen()/8+1+4)
	b = podEntriesPrefix(b, pod)
	b = append(b, byte(slices.Index(names, mapName)+1))
	b = append(b, peer.Addr().AsSlice()...)
	b = append(b, byte(peer.Bits()))
	return binary.BigEndian.AppendUint32(b, version)
}

// podEntriesPrefix appends the key prefix of a pod's entries to b.
func podEntriesPrefix(b []byte, pod netip.Addr) []byte {
	return append(append(b, byte(pod.BitLen()/8)), pod.AsSlice()...)
}

// PodEntries queries a pod IP's entries, in every map, with
// [statedb.Table.Prefix] (in the shell: `db/prefix policy-map-entries
// 10.0.0.5`).
func PodEntries(pod netip.Addr) statedb.Query[*PolicyMapEntry] {
	return PolicyEntryIndex.QueryFromKey(podEntriesPrefix(nil, pod))
}

// entryKeyFromString parses an entry's key as the shell gives it: "map
// pod peer version" (map one of names), "map pod peer" for db/prefix (its
// versions), or a pod IP alone for db/prefix.
func entryKeyFromString(names []string) func(string) (index.Key, error) {
	return func(s string) (index.Key, error) {
		f := strings.Fields(s)
		switch len(f) {
		case 1:
			pod, err := netip.ParseAddr(f[0])
			if err != nil {
				return nil, err
			}
			return podEntriesPrefix(nil, pod), nil
		case 3, 4:
		default:
			return nil, fmt.Errorf("%q: want \"map pod peer [version]\" or a pod IP", s)
		}
		if !slices.Contains(names, f[0]) {
			return nil, fmt.Errorf("%q: no map %q (%s)", s, f[0], strings.Join(names, ", "))
		}
		pod, err := netip.ParseAddr(f[1])
		if err != nil {
			return nil, err
		}
		peer, err := netip.ParsePrefix(f[2])
		if err != nil {
			return nil, err
		}
		id := mapEntryID(names, f[0], pod, peer.Masked(), 0)
		if len(f) == 3 {
			return id[:len(id)-4], nil
		}
		v, err := strconv.ParseUint(f[3], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q: version %q: %w", s, f[3], err)
		}
		return binary.BigEndian.AppendUint32(id[:len(id)-4], uint32(v)), nil
	}
}

// PolicyEntryIndex is the primary index: pod, map, peer, version. As a
// string query: "map pod peer version" ("enimasq_egress_v4 10.0.0.5
// 10.0.0.0/8 3"), or "map pod peer" or a pod IP alone for db/prefix.
var PolicyEntryIndex = statedb.Index[*PolicyMapEntry, PolicyEntryKey]{
	Name: "id",
	FromObject: func(e *PolicyMapEntry) index.KeySet {
		return index.NewKeySet(policyEntryID(e.Map(), e.Pod, e.Peer(), e.Version))
	},
	FromKey: func(k PolicyEntryKey) index.Key {
		return policyEntryID(k.Map, k.Pod, k.Peer, k.Version)
	},
	FromString: entryKeyFromString(bpf.PolicyMapNames),
	Unique:     true,
}

// NewPolicyMapEntriesTable creates and registers policy-map-entries. It
// has no secondary index: each costs a tree node and a watch channel per
// row, and a pod's entries are a prefix of the primary key (PodEntries).
func NewPolicyMapEntriesTable(db *statedb.DB) (statedb.RWTable[*PolicyMapEntry], error) {
	return statedb.NewTable(db, PolicyMapEntriesTableName, PolicyEntryIndex)
}
