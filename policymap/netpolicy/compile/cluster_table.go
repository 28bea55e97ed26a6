package compile

import (
	"encoding/json"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
)

// ClusterMapEntriesTableName is the table of cluster map entries.
const ClusterMapEntriesTableName = "cluster-policy-map-entries"

// ClusterMapEntry is one entry of a cluster map: what the Admin and
// Baseline tiers decide for a pod and the peers in a prefix, in one
// direction, per interval of the port space. Objects in the table are
// immutable; like PolicyMapEntry, a row points at its compiled template
// entry, shared by the pods of one selection.
type ClusterMapEntry struct {
	Pod     netip.Addr
	Version uint32 // see PolicyMapEntry.Version
	Status  reconciler.Status
	t       *templateEntry
}

func (e *ClusterMapEntry) MapName() string  { return e.t.mapName }
func (e *ClusterMapEntry) MapValue() []byte { return e.t.value.bytes }

// MapKey encodes the kernel key (see PolicyMapEntry.MapKey).
func (e *ClusterMapEntry) MapKey() []byte {
	k, err := bpf.AppendPolicyKeyVersion(make([]byte, 0, 8+2*e.Pod.BitLen()/8), e.Pod, e.Version, e.t.peer)
	if err != nil {
		return nil
	}
	return k
}

// SpillMap and Spill are the value's chunks (bpf.Spiller).
func (e *ClusterMapEntry) SpillMap() string {
	if len(e.t.value.chunks) == 0 {
		return ""
	}
	return bpf.ClusterChunksMapName
}
func (e *ClusterMapEntry) Spill() []bpf.SpillEntry { return e.t.value.chunks }

func (e *ClusterMapEntry) Map() string        { return e.t.mapName }
func (e *ClusterMapEntry) Peer() netip.Prefix { return e.t.peer }

// Tiers is the value as text: per interval, the Admin and Baseline winners.
func (e *ClusterMapEntry) Tiers() string       { return e.t.value.text }
func (e *ClusterMapEntry) EncodeError() string { return e.t.value.err }

func (e *ClusterMapEntry) Clone() *ClusterMapEntry { c := *e; return &c }

func (e *ClusterMapEntry) GetStatus() reconciler.Status { return e.Status }

func (e *ClusterMapEntry) SetStatus(s reconciler.Status) *ClusterMapEntry {
	e.Status = s
	return e
}

func (e *ClusterMapEntry) sameDesired(o *ClusterMapEntry) bool {
	a, b := e.t, o.t
	return e.Pod == o.Pod && (a == b || a.mapName == b.mapName && a.peer == b.peer && a.value.err == b.value.err &&
		string(a.value.bytes) == string(b.value.bytes) && a.value.text == b.value.text)
}

func (e *ClusterMapEntry) TableHeader() []string {
	return []string{"Map", "Pod", "Peer", "Tiers", "Status", "Error", "Version"}
}

func (e *ClusterMapEntry) TableRow() []string {
	var errs []string
	if msg := e.EncodeError(); msg != "" {
		errs = append(errs, msg)
	}
	if msg := e.Status.GetError(); msg != "" {
		errs = append(errs, msg)
	}
	return []string{e.Map(), e.Pod.String(), e.Peer().String(), e.Tiers(), e.Status.Kind.String(), strings.Join(errs, "; "),
		strconv.FormatUint(uint64(e.Version), 10)}
}

type clusterMapEntryView struct {
	Map     string            `json:"Map" yaml:"map"`
	Pod     netip.Addr        `json:"Pod" yaml:"pod"`
	Version uint32            `json:"Version" yaml:"version"`
	Peer    netip.Prefix      `json:"Peer" yaml:"peer"`
	Tiers   string            `json:"Tiers" yaml:"tiers"`
	Error   string            `json:"Error,omitempty" yaml:"error,omitempty"`
	Status  reconciler.Status `json:"Status" yaml:"status"`
}

func (e *ClusterMapEntry) view() clusterMapEntryView {
	return clusterMapEntryView{Map: e.Map(), Pod: e.Pod, Version: e.Version, Peer: e.Peer(), Tiers: e.Tiers(), Error: e.EncodeError(), Status: e.Status}
}

func (e *ClusterMapEntry) MarshalJSON() ([]byte, error) { return json.Marshal(e.view()) }
func (e *ClusterMapEntry) MarshalYAML() (any, error)    { return e.view(), nil }

func (e *ClusterMapEntry) Key() PolicyEntryKey {
	return PolicyEntryKey{e.Map(), e.Pod, e.Peer(), e.Version}
}

// clusterEntryID is the primary key: as policyEntryID, by position in
// bpf.ClusterMapNames.
func clusterEntryID(mapName string, pod netip.Addr, peer netip.Prefix, version uint32) index.Key {
	return mapEntryID(bpf.ClusterMapNames, mapName, pod, peer, version)
}

// ClusterPodEntries queries a pod IP's cluster entries.
func ClusterPodEntries(pod netip.Addr) statedb.Query[*ClusterMapEntry] {
	return ClusterEntryIndex.QueryFromKey(podEntriesPrefix(nil, pod))
}

// ClusterEntryIndex is the primary index: pod, map, peer, version (as
// PolicyEntryIndex).
var ClusterEntryIndex = statedb.Index[*ClusterMapEntry, PolicyEntryKey]{
	Name: "id",
	FromObject: func(e *ClusterMapEntry) index.KeySet {
		return index.NewKeySet(clusterEntryID(e.Map(), e.Pod, e.Peer(), e.Version))
	},
	FromKey:    func(k PolicyEntryKey) index.Key { return clusterEntryID(k.Map, k.Pod, k.Peer, k.Version) },
	FromString: entryKeyFromString(bpf.ClusterMapNames),
	Unique:     true,
}

// NewClusterMapEntriesTable creates and registers
// cluster-policy-map-entries.
func NewClusterMapEntriesTable(db *statedb.DB) (statedb.RWTable[*ClusterMapEntry], error) {
	return statedb.NewTable(db, ClusterMapEntriesTableName, ClusterEntryIndex)
}

// stampCluster appends the template's entries for a pod IP as cluster rows.
func (t *policyTemplate) stampCluster(out []*ClusterMapEntry, pod netip.Addr) []*ClusterMapEntry {
	rows := make([]ClusterMapEntry, 0, t.n)
	for _, b := range t.blocks {
		for i := range b {
			rows = append(rows, ClusterMapEntry{Pod: pod, t: &b[i]})
			out = append(out, &rows[len(rows)-1])
		}
	}
	return out
}
