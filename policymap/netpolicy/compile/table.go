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

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
)

// The map-entries tables: policy-map-entries (PolicyMapEntry) and
// cluster-policy-map-entries (ClusterMapEntry), one row per entry of a
// map, written alike and told apart only by their kind (kinds.go).

// portValue is a compiled map value: its kernel bytes, its chunks (the
// intervals past the value's, in the kind's chunk map), its text and, when
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

// entryKind is what a row and its maps need of their kind: the kind's
// table and maps, its chunk map and how its value is shown.
type entryKind interface {
	// tableName is the name of the kind's table.
	tableName() string
	// mapNames are the kind's maps; a map's position orders the keys.
	mapNames() []string
	// mapSpec is the spec of the kind's map of a direction and family.
	mapSpec(policybpf.Direction, bpf.Family, uint32) *ebpf.MapSpec
	// chunksMap is the map of the values' chunks.
	chunksMap() string
	// valueColumn is the header of the value's text.
	valueColumn() string
	// view is how a row marshals (statedb dump, db/show
	// --format=json|yaml).
	view(entryView) any
}

// MapEntry is one entry of a policy map of kind K: for a pod, the peers
// in a prefix and one direction, what the kind's value decides (the
// ports a NetworkPolicy allows; the Admin and Baseline tiers' winners per
// port interval). Objects in the table are immutable.
//
// A row is small (80 bytes) because a node may hold hundreds of thousands:
// the map, peer, value and its text are those of a compiled template entry,
// shared by every pod of the selection it was compiled for; the kernel key
// is encoded when the reconciler asks for it. It prints, and marshals to
// JSON and YAML, as the fields Map, Pod, Peer, the value (Ports or
// Tiers), Error and Status.
type MapEntry[K entryKind] struct {
	Pod netip.Addr
	// Version is the version of the pod's policy the entry belongs to
	// (versions.go): the programs look the pod's keys up at the version
	// in force.
	Version uint32
	Status  reconciler.Status
	t       *templateEntry
}

// PolicyMapEntry is one entry of a network-policy map
// (enimasq_egress_v4, ...), a row of policy-map-entries.
type PolicyMapEntry = MapEntry[policyKind]

// ClusterMapEntry is one entry of a cluster map (enimasq_cluster_egress_v4,
// ...), a row of cluster-policy-map-entries.
type ClusterMapEntry = MapEntry[clusterKind]

func (e *MapEntry[K]) MapName() string  { return e.t.mapName }
func (e *MapEntry[K]) MapValue() []byte { return e.t.value.bytes }

// SpillMap and Spill are the value's chunks (bpf.Spiller), written before
// the entry.
func (e *MapEntry[K]) SpillMap() string {
	if len(e.t.value.chunks) == 0 {
		return ""
	}
	var k K
	return k.chunksMap()
}
func (e *MapEntry[K]) Spill() []bpf.SpillEntry { return e.t.value.chunks }

// MapKey encodes the kernel key: pod and peer are of one family by
// construction (a template is compiled for the family of its pods), so it
// does not fail; if it ever did, the nil key fails the operation and the
// entry shows the error.
func (e *MapEntry[K]) MapKey() []byte {
	k, err := bpf.AppendPolicyKeyVersion(make([]byte, 0, 8+2*e.Pod.BitLen()/8), e.Pod, e.Version, e.t.peer)
	if err != nil {
		return nil
	}
	return k
}

// Map is the map: enimasq_egress_v4, enimasq_cluster_egress_v4, ...
func (e *MapEntry[K]) Map() string { return e.t.mapName }

// Peer is the peer prefix of the key.
func (e *MapEntry[K]) Peer() netip.Prefix { return e.t.peer }

// ValueText is the value as text: for a NetworkPolicy map "deny", "any",
// or "tcp/80,udp/53"; for a cluster map, per interval, the Admin and
// Baseline winners.
func (e *MapEntry[K]) ValueText() string { return e.t.value.text }

// EncodeError is set when the value cannot be encoded (never for a
// compiled value): the key then denies (fails closed).
func (e *MapEntry[K]) EncodeError() string { return e.t.value.err }

// Clone is a copy, for the reconciler to set its status on.
func (e *MapEntry[K]) Clone() *MapEntry[K] { c := *e; return &c }

// GetStatus and SetStatus are the reconciler's status of the row.
func (e *MapEntry[K]) GetStatus() reconciler.Status { return e.Status }

func (e *MapEntry[K]) SetStatus(s reconciler.Status) *MapEntry[K] {
	e.Status = s
	return e
}

// atVersion is a copy at a version, Pending (versionedRow).
func (e *MapEntry[K]) atVersion(v uint32) *MapEntry[K] {
	c := *e
	c.Version, c.Status = v, reconciler.StatusPending()
	return &c
}

// sameDesired reports whether two entries ask for the same kernel state
// (statuses and versions aside).
func (e *MapEntry[K]) sameDesired(o *MapEntry[K]) bool {
	if e.Pod != o.Pod {
		return false
	}
	a, b := e.t, o.t
	return a == b || a.mapName == b.mapName && a.peer == b.peer &&
		(a.value == b.value || a.value.err == b.value.err && bytes.Equal(a.value.bytes, b.value.bytes) &&
			a.value.text == b.value.text)
}

func (e *MapEntry[K]) TableHeader() []string {
	var k K
	return []string{"Map", "Pod", "Peer", k.valueColumn(), "Status", "Error", "Version"}
}

func (e *MapEntry[K]) TableRow() []string {
	var errs []string
	if msg := e.EncodeError(); msg != "" {
		errs = append(errs, msg)
	}
	if msg := e.Status.GetError(); msg != "" {
		errs = append(errs, msg)
	}
	return []string{e.Map(), e.Pod.String(), e.Peer().String(), e.ValueText(), e.Status.Kind.String(), strings.Join(errs, "; "),
		strconv.FormatUint(uint64(e.Version), 10)}
}

// entryView is a row's fields as it marshals; the kind names the value's
// field (entryKind.view).
type entryView struct {
	Map     string
	Pod     netip.Addr
	Version uint32
	Peer    netip.Prefix
	Value   string
	Error   string
	Status  reconciler.Status
}

func (e *MapEntry[K]) view() any {
	var k K
	return k.view(entryView{Map: e.Map(), Pod: e.Pod, Version: e.Version, Peer: e.Peer(), Value: e.ValueText(),
		Error: e.EncodeError(), Status: e.Status})
}

func (e *MapEntry[K]) MarshalJSON() ([]byte, error) { return json.Marshal(e.view()) }

func (e *MapEntry[K]) MarshalYAML() (any, error) { return e.view(), nil }

// PolicyEntryKey is the primary key of a map entry, of either kind.
type PolicyEntryKey struct {
	Map     string
	Pod     netip.Addr
	Peer    netip.Prefix
	Version uint32
}

func (e *MapEntry[K]) Key() PolicyEntryKey {
	return PolicyEntryKey{e.Map(), e.Pod, e.Peer(), e.Version}
}

// rowID is the primary key, in bytes that sort by pod (IPv4 first),
// then map, then peer, then version: the pod's address length, the pod,
// the map's position in the kind's maps (plus one; 0 for a name that is
// not one of them), the peer and its length, the version (big endian). A
// pod's entries are the ones under podEntriesPrefix. 15 bytes for IPv4.
func rowID[K entryKind](mapName string, pod netip.Addr, peer netip.Prefix, version uint32) index.Key {
	var k K
	return mapEntryID(k.mapNames(), mapName, pod, peer, version)
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

// entryIndexName is the name of the primary index of both tables.
const entryIndexName = "id"

// newEntryIndex is the primary index of a kind's table: pod, map, peer,
// version. As a string query: "map pod peer version" ("enimasq_egress_v4
// 10.0.0.5 10.0.0.0/8 3"), or "map pod peer" or a pod IP alone for
// db/prefix.
func newEntryIndex[K entryKind]() statedb.Index[*MapEntry[K], PolicyEntryKey] {
	var k K
	return statedb.Index[*MapEntry[K], PolicyEntryKey]{
		Name: entryIndexName,
		FromObject: func(e *MapEntry[K]) index.KeySet {
			return index.NewKeySet(rowID[K](e.Map(), e.Pod, e.Peer(), e.Version))
		},
		FromKey: func(k PolicyEntryKey) index.Key {
			return rowID[K](k.Map, k.Pod, k.Peer, k.Version)
		},
		FromString: entryKeyFromString(k.mapNames()),
		Unique:     true,
	}
}

// entryQuery queries the row of a key in a kind's table.
func entryQuery[K entryKind](key PolicyEntryKey) statedb.Query[*MapEntry[K]] {
	return statedb.Index[*MapEntry[K], PolicyEntryKey]{Name: entryIndexName}.
		QueryFromKey(rowID[K](key.Map, key.Pod, key.Peer, key.Version))
}

// podEntries queries a pod IP's entries in a kind's table, in every map,
// with [statedb.Table.Prefix].
func podEntries[K entryKind](pod netip.Addr) statedb.Query[*MapEntry[K]] {
	return statedb.Index[*MapEntry[K], PolicyEntryKey]{Name: entryIndexName}.QueryFromKey(podEntriesPrefix(nil, pod))
}

// newEntriesTable creates and registers a kind's table. It has no
// secondary index: each costs a tree node and a watch channel per row,
// and a pod's entries are a prefix of the primary key (podEntries).
func newEntriesTable[K entryKind](db *statedb.DB) (statedb.RWTable[*MapEntry[K]], error) {
	var k K
	return statedb.NewTable(db, k.tableName(), newEntryIndex[K]())
}

// PolicyEntryIndex is the primary index of policy-map-entries (see
// newEntryIndex).
var PolicyEntryIndex = newEntryIndex[policyKind]()

// ClusterEntryIndex is the primary index of cluster-policy-map-entries.
var ClusterEntryIndex = newEntryIndex[clusterKind]()

// PodEntries queries a pod IP's entries, in every map, with
// [statedb.Table.Prefix] (in the shell: `db/prefix policy-map-entries
// 10.0.0.5`).
func PodEntries(pod netip.Addr) statedb.Query[*PolicyMapEntry] { return podEntries[policyKind](pod) }

// ClusterPodEntries queries a pod IP's cluster entries.
func ClusterPodEntries(pod netip.Addr) statedb.Query[*ClusterMapEntry] {
	return podEntries[clusterKind](pod)
}

// NewPolicyMapEntriesTable creates and registers policy-map-entries.
func NewPolicyMapEntriesTable(db *statedb.DB) (statedb.RWTable[*PolicyMapEntry], error) {
	return newEntriesTable[policyKind](db)
}

// NewClusterMapEntriesTable creates and registers
// cluster-policy-map-entries.
func NewClusterMapEntriesTable(db *statedb.DB) (statedb.RWTable[*ClusterMapEntry], error) {
	return newEntriesTable[clusterKind](db)
}
