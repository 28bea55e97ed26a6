package netpolicy

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/cells/nodeips"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// Cell reads PolicyEndpoint objects into policy-endpoints, compiles them
// into policy-map-entries and reconciles that into the network-policy maps
// enimasq_egress_v4/_v6 and enimasq_ingress_v4/_v6 (with
// --enable-network-policy). It goes in [policymap.Module].
var Cell = cell.Group(
	SourceCell,
	MapCells,
	EnforceCells,
)

// SourceCell fills policy-endpoints from the PolicyEndpoint directory or the
// API server.
var SourceCell = cell.Invoke(registerPolicySource)

// MapCells are the network-policy tables, the compiler and the reconciler
// of the policy maps: everything but the source, which tests replace by
// writing policy-endpoints themselves.
var MapCells = cell.Group(
	cell.Config(DefaultPolicyConfig),
	endpoints.Cell,
	cell.ProvidePrivate(
		NewPolicyMapEntriesTable,
		newMaps,
		newPolicyState,
		newPolicyMetrics,
	),
	cell.Provide(
		statedb.RWTable[*PolicyMapEntry].ToTable,
		policyScriptCommands,
		policymap.TableMetrics[*PolicyMapEntry],
		(*policyMetrics).collectors,
	),
	cell.Invoke(registerPolicyMaps),
)

func newMaps(p policymap.MapsParams) *policymap.Maps[*PolicyMapEntry] {
	return policymap.NewMaps[*PolicyMapEntry](p, PolicyMapEntriesTableName)
}

type policySourceParams struct {
	cell.In

	Log    *slog.Logger
	Node   nodeconfig.Config
	Policy PolicyConfig
	DB     *statedb.DB
	Table  statedb.RWTable[*PolicyEndpoint]
	Jobs   job.Group
	Health cell.Health
	// Client, when enabled, makes the API server's PolicyEndpoints the
	// source instead of --policy-endpoints-path.
	Client *k8sclient.Client `optional:"true"`
	// NodeIPs are this node's addresses (the node rule of the API
	// source); needed with the API server only.
	NodeIPs statedb.Table[*nodeips.NodeIP] `optional:"true"`
	Metrics *policyMetrics                 `optional:"true"`
}

// registerPolicySource fills policy-endpoints from the PolicyEndpoint
// directory, or from the API server when the client is enabled (then
// --policy-endpoints-path is an error). With --enable-network-policy=false
// the table is initialized and stays empty.
func registerPolicySource(p policySourceParams) error {
	api := p.Client != nil && p.Client.IsEnabled()
	if err := p.Policy.validate(api); err != nil {
		return err
	}
	if err := checkPolicySource(p.Policy, p.Client); err != nil {
		return err
	}
	initName := "policy-endpoints-dir"
	if api && p.Policy.EnableNetworkPolicy {
		initName = "policy-endpoints-api"
	}
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, initName)
	if !p.Policy.EnableNetworkPolicy {
		initDone(wtxn)
		wtxn.Commit()
		p.Health.NewScope("policy").OK("No policy maps: --enable-network-policy=false")
		return nil
	}
	wtxn.Commit()

	s := newPolicySource(p, initDone)
	if api {
		if p.NodeIPs == nil {
			return fmt.Errorf("PolicyEndpoints from the API server need the %s table (nodeips.Cell) to tell the pods of this node", nodeips.TableName)
		}
		p.Jobs.Add(job.OneShot("watch-policy-endpoints", newPolicyK8sSource(s, p.Client, p.NodeIPs).run))
		return nil
	}
	p.Jobs.Add(job.OneShot("watch-policy-endpoints", s.Run))
	return nil
}

type policyMapParams struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Node      nodeconfig.Config
	Config    policymap.Config
	Policy    PolicyConfig
	DB        *statedb.DB
	Jobs      job.Group
	Endpoints statedb.RWTable[*PolicyEndpoint]
	Entries   statedb.RWTable[*PolicyMapEntry]
	Reconcile reconciler.Params
	Ops       *policymap.Maps[*PolicyMapEntry]
	State     *policyState
	Metrics   *policyMetrics
	Client    *k8sclient.Client `optional:"true"`
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

// registerPolicyMaps derives policy-map-entries from policy-endpoints and
// reconciles it into the policy maps of the node's families. Nothing is
// registered (no maps are made) while network policy is disabled.
func registerPolicyMaps(p policyMapParams) error {
	if err := p.Policy.validate(p.Client != nil && p.Client.IsEnabled()); err != nil {
		return err
	}
	if !p.Policy.EnableNetworkPolicy {
		return nil
	}

	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			for _, f := range policyMapFamilies(p.Node) {
				for _, d := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
					if err := p.Ops.Open(p.Log, bpf.PolicyMapSpec(d, f, p.Policy.PolicyMapMaxEntries), p.Node.GlobalsDir()); err != nil {
						return err
					}
				}
			}
			return nil
		},
		OnStop: func(cell.HookContext) error {
			p.Ops.Close()
			return nil
		},
	})

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
