package compile

import (
	"context"
	"log/slog"
	"maps"
	"runtime"
	"runtime/debug"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// Cell derives policy-map-entries from policy-endpoints and reconciles it
// into the network-policy maps enimasq_egress_v4/_v6 and
// enimasq_ingress_v4/_v6. It takes Settings and the policy-endpoints table
// (package endpoints), and provides policy-map-entries and the maps
// (*policymap.Maps[*PolicyMapEntry]).
//
// It derives cluster-policy-map-entries from cluster-policy-endpoints the
// same way, into the cluster maps enimasq_cluster_egress_v4/_v6 and
// enimasq_cluster_ingress_v4/_v6 (cluster.go), and provides both sets of
// maps as KernelMaps.
var Cell = cell.Group(
	cell.ProvidePrivate(
		NewPolicyMapEntriesTable,
		NewClusterMapEntriesTable,
		NewPolicyVersionsTable,
		newPolicyVersions,
		(*policyVersions).kernelMaps,
		newMaps,
		newClusterMaps,
		newPolicyState,
		newPolicyMetrics,
	),
	cell.Provide(
		statedb.RWTable[*PolicyMapEntry].ToTable,
		statedb.RWTable[*ClusterMapEntry].ToTable,
		statedb.RWTable[*PodVersions].ToTable,
		policymap.TableMetrics[*PolicyMapEntry],
		policymap.TableMetrics[*ClusterMapEntry],
		policymap.TableMetrics[*PodVersions],
		(*policyMetrics).collectors,
		newKernelMaps,
	),
	cell.Invoke(registerPolicyMaps, registerClusterMaps, registerVersions),
)

func newMaps(p policymap.MapsParams) *policymap.Maps[*PolicyMapEntry] {
	return policymap.NewMaps[*PolicyMapEntry](p, PolicyMapEntriesTableName)
}

func newClusterMaps(p policymap.MapsParams) *policymap.Maps[*ClusterMapEntry] {
	return policymap.NewMaps[*ClusterMapEntry](p, ClusterMapEntriesTableName)
}

// KernelMaps are the NetworkPolicy and the cluster maps with their chunk
// maps, as open: what the programs, the listings and the verdicts read.
type KernelMaps struct {
	Policy   *policymap.Maps[*PolicyMapEntry]
	Cluster  *policymap.Maps[*ClusterMapEntry]
	Versions *policymap.Maps[*PodVersions]
}

func newKernelMaps(p *policymap.Maps[*PolicyMapEntry], c *policymap.Maps[*ClusterMapEntry], v *policyVersions) KernelMaps {
	return KernelMaps{Policy: p, Cluster: c, Versions: v.maps}
}

// Opened is a copy of every open map of both tiers and the versions map,
// by name.
func (k KernelMaps) Opened() map[string]bpf.PinnedMap {
	out := k.Policy.Opened()
	maps.Copy(out, k.Cluster.Opened())
	if k.Versions != nil {
		maps.Copy(out, k.Versions.Opened())
	}
	return out
}

type clusterMapParams struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Node      nodeconfig.Config
	Config    policymap.Config
	Settings  Settings
	DB        *statedb.DB
	Jobs      job.Group
	CPEs      statedb.Table[*endpoints.ClusterPolicyEndpoint]
	Entries   statedb.RWTable[*ClusterMapEntry]
	Versions  statedb.RWTable[*PodVersions]
	State     *policyVersions
	Reconcile reconciler.Params
	Ops       *policymap.Maps[*ClusterMapEntry]
}

// registerClusterMaps derives cluster-policy-map-entries from
// cluster-policy-endpoints and reconciles it into the cluster maps of the
// node's families, as registerPolicyMaps does for PolicyEndpoints.
func registerClusterMaps(p clusterMapParams) error {
	if p.Settings.Off != "" {
		return nil
	}
	openMaps(p.Lifecycle, p.Log, p.Node, p.Ops, bpf.ClusterMapSpec, bpf.ClusterChunksMapName, p.Settings.MaxEntries)
	wtxn := p.DB.WriteTxn(p.Entries)
	initDone := p.Entries.RegisterInitializer(wtxn, "derive-cluster-policy-map-entries")
	wtxn.Commit()
	d := &clusterDeriver{log: p.Log, db: p.DB, cpes: p.CPEs, entries: p.Entries, versions: p.Versions, state: p.State,
		node: p.Node, initDone: initDone}
	p.Jobs.Add(job.OneShot("derive-cluster-policy-map-entries", d.run))
	p.Jobs.Add(job.Timer("check-cluster-policy-map-pins", func(context.Context) error { return p.Ops.CheckPins(p.Log) },
		p.Config.BPFMapRefreshInterval))
	_, err := policymap.RegisterReconciler(p.Reconcile, p.Jobs, p.Config, "cluster-policy-map", p.Entries,
		(*ClusterMapEntry).Clone, (*ClusterMapEntry).SetStatus, (*ClusterMapEntry).GetStatus, p.Ops.Ops(), p.Ops.Ops())
	return err
}

type policyMapParams struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Node      nodeconfig.Config
	Config    policymap.Config
	Settings  Settings
	DB        *statedb.DB
	Jobs      job.Group
	Endpoints statedb.Table[*endpoints.PolicyEndpoint]
	Entries   statedb.RWTable[*PolicyMapEntry]
	Versions  statedb.RWTable[*PodVersions]
	Reconcile reconciler.Params
	Ops       *policymap.Maps[*PolicyMapEntry]
	State     *policyState
	Versioned *policyVersions
	Metrics   *policyMetrics
}

// policyState holds what the policy-map reconciler registration made, for
// the script commands and tests.
type policyState struct {
	// reconciler is nil while network policy is disabled.
	reconciler reconciler.Reconciler[*PolicyMapEntry]
}

func newPolicyState() *policyState { return &policyState{} }

// policyMapFamilies are the families whose policy maps the node gets.
func policyMapFamilies(node nodeconfig.Config) []bpf.Family {
	var out []bpf.Family
	if node.EnableIPv4 {
		out = append(out, bpf.IPv4)
	}
	if node.EnableIPv6 {
		out = append(out, bpf.IPv6)
	}
	return out
}

// openMaps opens, at start, the maps of spec for every direction and family
// of the node, and their chunk map, and closes them at stop (their pins
// stay): the NetworkPolicy and the cluster maps alike.
func openMaps[E bpf.Entry](lc cell.Lifecycle, log *slog.Logger, node nodeconfig.Config, ops *policymap.Maps[E],
	spec func(bpf.Direction, bpf.Family, uint32) *ebpf.MapSpec, chunks string, maxEntries uint32) {
	lc.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			for _, f := range policyMapFamilies(node) {
				for _, d := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
					if err := ops.Open(log, spec(d, f, maxEntries), node.GlobalsDir()); err != nil {
						return err
					}
				}
			}
			return ops.OpenSpill(log, bpf.ChunkMapSpec(chunks, maxEntries), node.GlobalsDir())
		},
		OnStop: func(cell.HookContext) error {
			ops.Close()
			return nil
		},
	})
}

// registerPolicyMaps derives policy-map-entries from policy-endpoints and
// reconciles it into the policy maps of the node's families. Nothing is
// registered (no maps are made) while network policy is disabled.
func registerPolicyMaps(p policyMapParams) error {
	if p.Settings.Off != "" {
		return nil
	}

	openMaps(p.Lifecycle, p.Log, p.Node, p.Ops, bpf.PolicyMapSpec, bpf.PolicyChunksMapName, p.Settings.MaxEntries)

	// The entries are initialized by the deriver once policy-endpoints is
	// and its objects are compiled: pruning waits for both.
	wtxn := p.DB.WriteTxn(p.Entries)
	initDone := p.Entries.RegisterInitializer(wtxn, "derive-policy-map-entries")
	wtxn.Commit()
	d := &policyDeriver{
		metrics:   p.Metrics,
		log:       p.Log,
		db:        p.DB,
		endpoints: p.Endpoints,
		entries:   p.Entries,
		versions:  p.Versions,
		state:     p.Versioned,
		node:      p.Node,
		initDone:  initDone,

		returnMemory:      func() { returnMemory(p.Log) },
		returnMemoryAfter: defaultReturnMemoryAfter,
	}
	p.Jobs.Add(job.OneShot("derive-policy-map-entries", d.run))
	// The pins are the maps the reconciler writes (policymap.Maps.CheckPins).
	p.Jobs.Add(job.Timer("check-policy-map-pins", func(context.Context) error { return p.Ops.CheckPins(p.Log) },
		p.Config.BPFMapRefreshInterval))

	rec, err := policymap.RegisterReconciler(p.Reconcile, p.Jobs, p.Config, "policy-map", p.Entries,
		(*PolicyMapEntry).Clone, (*PolicyMapEntry).SetStatus, (*PolicyMapEntry).GetStatus, p.Ops.Ops(), p.Ops.Ops())
	p.State.reconciler = rec
	return err
}

// returnMemory gives the pages of freed memory back to the OS and logs the
// heap before and after.
func returnMemory(log *slog.Logger) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	debug.FreeOSMemory()
	runtime.ReadMemStats(&after)
	log.Info("Returned freed memory to the OS after a large policy change",
		"heap-in-use-mb", after.HeapInuse>>20, "released-mb", (after.HeapReleased-before.HeapReleased)>>20)
}
