package compile

import (
	"context"
	"log/slog"
	"maps"
	"runtime"
	"runtime/debug"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// Cell derives, for each kind of policy object (kinds.go), its map-entries
// table from its objects' table and reconciles it into the kind's maps:
// policy-map-entries from policy-endpoints (package endpoints) into the
// network-policy maps enimasq_egress_v4/_v6 and enimasq_ingress_v4/_v6,
// cluster-policy-map-entries from cluster-policy-endpoints into the
// cluster maps enimasq_cluster_egress_v4/_v6 and
// enimasq_cluster_ingress_v4/_v6 (cluster.go). It takes Settings and the
// objects' tables, and provides the entries tables, the maps
// (*policymap.Maps[*PolicyMapEntry], ...) and both sets of maps as
// KernelMaps.
var Cell = cell.Group(
	cell.ProvidePrivate(
		newEntriesTable[policyKind],
		newEntriesTable[clusterKind],
		NewPolicyVersionsTable,
		newPolicyVersions,
		(*policyVersions).kernelMaps,
		newMaps[policyKind],
		newMaps[clusterKind],
		newReconcilerState[policyKind],
		newReconcilerState[clusterKind],
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
	cell.Invoke(
		registerMigration, // before any map is opened (migrate.go)
		registerMaps[*endpoints.PolicyEndpoint, policyKind],
		registerMaps[*endpoints.ClusterPolicyEndpoint, clusterKind],
		registerVersions,
	),
)

// newMaps are a kind's maps, reconciled from its table.
func newMaps[K entryKind](p policymap.MapsParams) *policymap.Maps[*MapEntry[K]] {
	var k K
	return policymap.NewMaps[*MapEntry[K]](p, k.tableName())
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

// registration is what every registration of the cell takes.
type registration struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Node      nodeconfig.Config
	Config    policymap.Config
	Settings  Settings
	DB        *statedb.DB
	Jobs      job.Group
	Reconcile reconciler.Params
}

// mapsParams are what a kind's deriver and reconciler take.
type mapsParams[T policyRow[T], K kind[T]] struct {
	cell.In
	Common registration

	Objects   statedb.Table[T]
	Names     statedb.Table[*endpoints.DNSName] `optional:"true"`
	Entries   statedb.RWTable[*MapEntry[K]]
	Versions  statedb.RWTable[*PodVersions]
	Ops       *policymap.Maps[*MapEntry[K]]
	State     *reconcilerState[K]
	Versioned *policyVersions
	Metrics   *policyMetrics
}

// reconcilerState holds what a kind's reconciler registration made, for
// the script commands and tests.
type reconcilerState[K entryKind] struct {
	// reconciler is nil while network policy is disabled.
	reconciler reconciler.Reconciler[*MapEntry[K]]
}

// policyState is the NetworkPolicy maps' reconciler.
type policyState = reconcilerState[policyKind]

func newReconcilerState[K entryKind]() *reconcilerState[K] { return &reconcilerState[K]{} }

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

// openMaps opens, at start, a kind's maps for every direction and family
// of the node, and its chunk map, and closes them at stop (their pins
// stay).
func openMaps[K entryKind](p registration, ops *policymap.Maps[*MapEntry[K]]) {
	var k K
	maxEntries := p.Settings.MaxEntries
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			for _, f := range policyMapFamilies(p.Node) {
				for _, d := range []policybpf.Direction{policybpf.Egress, policybpf.Ingress} {
					if err := ops.Open(p.Log, k.mapSpec(d, f, maxEntries), p.Node.GlobalsDir()); err != nil {
						return err
					}
				}
			}
			return ops.OpenSpill(p.Log, policybpf.ChunkMapSpec(k.chunksMap(), maxEntries), p.Node.GlobalsDir())
		},
		OnStop: func(cell.HookContext) error {
			ops.Close()
			return nil
		},
	})
}

// registerMaps derives a kind's map-entries table from its objects and
// reconciles it into the kind's maps of the node's families: the jobs
// derive-<table>, check-<reconciler>-pins and the reconciler. Nothing is
// registered (no maps are made) while network policy is disabled.
func registerMaps[T policyRow[T], K kind[T]](p mapsParams[T, K]) error {
	c := p.Common
	if c.Settings.Off != "" {
		return nil
	}
	var k K
	openMaps(c, p.Ops)

	// The entries are initialized by the deriver once the objects' table
	// is and its objects are compiled: pruning waits for both.
	derive := "derive-" + k.tableName()
	wtxn := c.DB.WriteTxn(p.Entries)
	initDone := p.Entries.RegisterInitializer(wtxn, derive)
	wtxn.Commit()
	d := &deriver[T, K]{
		log:       c.Log,
		db:        c.DB,
		endpoints: p.Objects,
		names:     p.Names,
		entries:   p.Entries,
		versions:  p.Versions,
		state:     p.Versioned,
		node:      c.Node,
		initDone:  initDone,
		prune: newPruneTrigger(pruneAfter, func() {
			if r := p.State.reconciler; r != nil {
				r.Prune()
			}
		}),

		returnMemory:      func() { returnMemory(c.Log) },
		returnMemoryAfter: defaultReturnMemoryAfter,
	}
	if k.timed() {
		d.metrics = p.Metrics
	}
	c.Jobs.Add(job.OneShot(derive, d.run))
	// The pins are the maps the reconciler writes (policymap.Maps.CheckPins).
	c.Jobs.Add(job.Timer("check-"+k.reconcilerName()+"-pins", func(context.Context) error { return p.Ops.CheckPins(c.Log) },
		c.Config.BPFMapRefreshInterval))

	rec, err := policymap.RegisterReconciler(c.Reconcile, c.Jobs, c.Config, k.reconcilerName(), p.Entries,
		(*MapEntry[K]).Clone, (*MapEntry[K]).SetStatus, (*MapEntry[K]).GetStatus, p.Ops.Ops(), p.Ops.Ops())
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
