package compile

import (
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The kinds of policy object the compiler derives maps from, one
// descriptor each: PolicyEndpoints (policyKind) and
// ClusterPolicyEndpoints (clusterKind). The deriver (derive.go), the
// map-entries tables (table.go), the maps and their reconciler (cell.go)
// and the versions (versions.go) are written once, for any kind; what a
// kind is made of is its descriptor, and its semantics (compile.go,
// sweep.go; cluster.go). A third kind costs one descriptor: a type with
// the methods of kind[T], a tier in policy-versions, and one line in Cell.

// kind describes one kind of policy object T: where its objects are, what
// it derives (a map-entries table of rows MapEntry[K], for K the
// descriptor itself), into which maps and tier of policy-versions, and how
// a selection of its objects compiles. A descriptor is a type without
// fields: its methods are the description.
type kind[T policyRow[T]] interface {
	entryKind
	// podIndex and parentIndex are the input table's indexes of an
	// object's pods and of its policy (endpoints.Union).
	podIndex() statedb.Index[T, netip.Addr]
	parentIndex() statedb.Index[T, string]
	// tier is the kind's versions in policy-versions (PodVersions.Tiers).
	tier() policybpf.PolicyTier
	// reconcilerName names the reconciler of the kind's maps; the pin
	// check is check-<name>-pins, the deriver derive-<table>.
	reconcilerName() string
	// compile compiles a selection into its templates, egress first: the
	// kind's semantics.
	compile(selection[T]) []*policyTemplate
	// weight is a selection's compile work: above backgroundWeight it
	// compiles off the derive loop.
	weight(selection[T]) int
	// timed says whether the deriver's compile times are
	// enimasq_policy_compile_duration_seconds (metrics.go).
	timed() bool
}

// PolicyMapEntriesTableName is the table of network-policy map entries.
const PolicyMapEntriesTableName = "policy-map-entries"

// ClusterMapEntriesTableName is the table of cluster map entries.
const ClusterMapEntriesTableName = "cluster-policy-map-entries"

// policyKind is the kind of PolicyEndpoints: policy-endpoints compiled
// (CompilePod) into policy-map-entries and the NetworkPolicy maps
// enimasq_egress_v4, ..., the NetworkPolicy tier of policy-versions.
type policyKind struct{}

func (policyKind) tableName() string          { return PolicyMapEntriesTableName }
func (policyKind) mapNames() []string         { return policybpf.PolicyMapNames }
func (policyKind) chunksMap() string          { return policybpf.PolicyChunksMapName }
func (policyKind) valueColumn() string        { return "Ports" }
func (policyKind) tier() policybpf.PolicyTier { return policybpf.TierNetworkPolicy }
func (policyKind) reconcilerName() string {
	return "policy-map"
}

func (policyKind) podIndex() statedb.Index[*endpoints.PolicyEndpoint, netip.Addr] {
	return endpoints.PolicyEndpointPodIndex
}

func (policyKind) parentIndex() statedb.Index[*endpoints.PolicyEndpoint, string] {
	return endpoints.PolicyEndpointParentIndex
}

func (policyKind) mapSpec(d policybpf.Direction, f bpf.Family, maxEntries uint32) *ebpf.MapSpec {
	return policybpf.PolicyMapSpec(d, f, maxEntries)
}

func (policyKind) compile(sel selection[*endpoints.PolicyEndpoint]) []*policyTemplate {
	return compileSelection(sel)
}

func (policyKind) weight(sel selection[*endpoints.PolicyEndpoint]) int { return weight(sel) }
func (policyKind) timed() bool                                         { return true }

// policyMapEntryView is how a PolicyMapEntry marshals.
type policyMapEntryView struct {
	Map     string            `json:"Map" yaml:"map"`
	Pod     netip.Addr        `json:"Pod" yaml:"pod"`
	Version uint32            `json:"Version" yaml:"version"`
	Peer    netip.Prefix      `json:"Peer" yaml:"peer"`
	Ports   string            `json:"Ports" yaml:"ports"`
	Error   string            `json:"Error,omitempty" yaml:"error,omitempty"`
	Status  reconciler.Status `json:"Status" yaml:"status"`
}

func (policyKind) view(v entryView) any {
	return policyMapEntryView{Map: v.Map, Pod: v.Pod, Version: v.Version, Peer: v.Peer, Ports: v.Value, Error: v.Error, Status: v.Status}
}

// clusterKind is the kind of ClusterPolicyEndpoints: cluster-policy-endpoints
// compiled (CompileClusterPod) into cluster-policy-map-entries and the
// cluster maps enimasq_cluster_egress_v4, ..., the cluster tier of
// policy-versions. Its objects are few and small: a selection never
// compiles in the background.
type clusterKind struct{}

func (clusterKind) tableName() string          { return ClusterMapEntriesTableName }
func (clusterKind) mapNames() []string         { return policybpf.ClusterMapNames }
func (clusterKind) chunksMap() string          { return policybpf.ClusterChunksMapName }
func (clusterKind) valueColumn() string        { return "Tiers" }
func (clusterKind) tier() policybpf.PolicyTier { return policybpf.TierCluster }
func (clusterKind) reconcilerName() string {
	return "cluster-policy-map"
}

func (clusterKind) podIndex() statedb.Index[*endpoints.ClusterPolicyEndpoint, netip.Addr] {
	return endpoints.ClusterPolicyEndpointPodIndex
}

func (clusterKind) parentIndex() statedb.Index[*endpoints.ClusterPolicyEndpoint, string] {
	return endpoints.ClusterPolicyEndpointParentIndex
}

func (clusterKind) mapSpec(d policybpf.Direction, f bpf.Family, maxEntries uint32) *ebpf.MapSpec {
	return policybpf.ClusterMapSpec(d, f, maxEntries)
}

func (clusterKind) compile(sel selection[*endpoints.ClusterPolicyEndpoint]) []*policyTemplate {
	return compileClusterSelection(sel)
}

func (clusterKind) weight(selection[*endpoints.ClusterPolicyEndpoint]) int { return 0 }
func (clusterKind) timed() bool                                            { return false }

// clusterMapEntryView is how a ClusterMapEntry marshals.
type clusterMapEntryView struct {
	Map     string            `json:"Map" yaml:"map"`
	Pod     netip.Addr        `json:"Pod" yaml:"pod"`
	Version uint32            `json:"Version" yaml:"version"`
	Peer    netip.Prefix      `json:"Peer" yaml:"peer"`
	Tiers   string            `json:"Tiers" yaml:"tiers"`
	Error   string            `json:"Error,omitempty" yaml:"error,omitempty"`
	Status  reconciler.Status `json:"Status" yaml:"status"`
}

func (clusterKind) view(v entryView) any {
	return clusterMapEntryView{Map: v.Map, Pod: v.Pod, Version: v.Version, Peer: v.Peer, Tiers: v.Value, Error: v.Error, Status: v.Status}
}

// Each descriptor is a kind (the generic code calls its methods through
// the type parameter, which staticcheck's unused does not follow).
var (
	_ kind[*endpoints.PolicyEndpoint]        = policyKind{}
	_ kind[*endpoints.ClusterPolicyEndpoint] = clusterKind{}
)
