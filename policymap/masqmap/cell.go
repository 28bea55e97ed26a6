package masqmap

import (
	"context"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/policymap"
)

// Cell derives masq-map-entries from ip-masq-agent-cidrs and reconciles it
// into cilium_ipmasq_v4/_v6. It goes in [policymap.Module].
var Cell = cell.Group(
	cell.ProvidePrivate(
		NewTable,
		newMaps,
	),
	cell.Provide(
		statedb.RWTable[*Entry].ToTable,
		scriptCommands,
		policymap.TableMetrics[*Entry],
	),
	cell.Invoke(register),
)

func newMaps(p policymap.MapsParams) *policymap.Maps[*Entry] {
	return policymap.NewMaps[*Entry](p, TableName)
}

type params struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	Node      nodeconfig.Config
	Config    policymap.Config
	Derive    statedb.DeriveParams[*ipmasq.CIDR, *Entry]
	Table     statedb.RWTable[*Entry]
	Reconcile reconciler.Params
	Maps      *policymap.Maps[*Entry]
	Health    cell.Health
}

// register derives masq-map-entries from ip-masq-agent-cidrs and
// reconciles it into the ipmasq maps. Nothing is registered (no maps are
// made) while the ip-masq-agent is disabled.
func register(p params) error {
	if err := p.Config.Validate(); err != nil {
		return err
	}
	if !p.Node.IPMasqAgent.Enabled {
		p.Health.NewScope("masq").OK("No ipmasq maps: --enable-ip-masq-agent=false")
		return nil
	}
	v4, v6 := masqFamilies(p.Node)

	// Open the enabled families' maps before the reconciler starts.
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			for _, fam := range []masqFamily{v4, v6} {
				if !fam.enabled {
					continue
				}
				if err := p.Maps.Open(p.Log, fam.spec(), p.Node.GlobalsDir()); err != nil {
					return err
				}
			}
			return nil
		},
		OnStop: func(cell.HookContext) error {
			p.Maps.Close()
			return nil
		},
	})

	// The pins are the maps the reconciler writes (policymap.Maps.CheckPins).
	p.Jobs.Add(job.Timer("check-masq-map-pins", func(context.Context) error { return p.Maps.CheckPins(p.Log) },
		p.Config.BPFMapRefreshInterval))

	statedb.Derive("derive-masq-map-entries",
		func(c *ipmasq.CIDR, deleted bool) (*Entry, statedb.DeriveResult) {
			if deleted {
				return &Entry{Prefix: c.Prefix}, statedb.DeriveDelete
			}
			return masqEntryFor(p.Log, v4, v6, c.Prefix), statedb.DeriveInsert
		})(p.Derive)

	_, err := policymap.RegisterReconciler(p.Reconcile, p.Jobs, p.Config, "masq-map", p.Table,
		(*Entry).Clone, (*Entry).SetStatus, (*Entry).GetStatus, p.Maps.Ops(), p.Maps.Ops())
	return err
}
