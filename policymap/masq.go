package policymap

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipmasq"
)

// masqFamily is one family's ipmasq map: programmed only when the family runs
// on the node and its masquerading is on.
type masqFamily struct {
	name    string // the map's name
	spec    func() *ebpf.MapSpec
	enabled bool
	skipped string // why the family is not programmed
}

func masqFamilies(node nodeconfig.Config) (v4, v6 masqFamily) {
	cfg := node.Masquerade
	v4 = masqFamily{name: "cilium_ipmasq_v4", spec: bpf.IPMasqV4Spec, enabled: true}
	v6 = masqFamily{name: "cilium_ipmasq_v6", spec: bpf.IPMasqV6Spec, enabled: true}
	switch {
	case !node.EnableIPv4:
		v4.enabled, v4.skipped = false, "IPv4 is disabled on this node (--enable-ipv4=false)"
	case !cfg.IPv4:
		v4.enabled, v4.skipped = false, "IPv4 masquerading is off (--enable-ipv4-masquerade=false)"
	}
	switch {
	case !node.EnableIPv6:
		v6.enabled, v6.skipped = false, "IPv6 is disabled on this node (--enable-ipv6=false)"
	case !cfg.IPv6:
		v6.enabled, v6.skipped = false, "IPv6 masquerading is off (--enable-ipv6-masquerade=false)"
	}
	return v4, v6
}

// masqEntryFor is the desired entry for a non-masquerade CIDR: an entry of
// its family's map, or a skipped entry when the family is not programmed.
// The key is built from the prefix of its own family only.
func masqEntryFor(log *slog.Logger, v4, v6 masqFamily, p netip.Prefix) *MasqEntry {
	fam := v4
	if !p.Addr().Is4() {
		fam = v6
	}
	if !fam.enabled {
		log.Info("Non-masquerade CIDR skipped", "prefix", p, "reason", fam.skipped)
		return &MasqEntry{Prefix: p, Skipped: fam.skipped}
	}
	key, err := bpf.EncodePrefix(p)
	if err != nil {
		// The ipmasq table only holds valid prefixes; say so if not.
		return &MasqEntry{Prefix: p, Skipped: fmt.Sprintf("cannot encode: %s", err)}
	}
	return &MasqEntry{Prefix: p, Map: fam.name, key: key, Status: reconciler.StatusPending()}
}

type masqParams struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	Node      nodeconfig.Config
	Config    Config
	Derive    statedb.DeriveParams[*ipmasq.CIDR, *MasqEntry]
	Table     statedb.RWTable[*MasqEntry]
	Reconcile reconciler.Params
	Ops       *mapOps[*MasqEntry]
	Health    cell.Health
}

// registerMasq derives masq-map-entries from ip-masq-agent-cidrs and
// reconciles it into the ipmasq maps. Nothing is registered (no maps are
// made) while the ip-masq-agent is disabled.
func registerMasq(p masqParams) error {
	if err := p.Config.validate(); err != nil {
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
				if err := p.Ops.open(p.Log, fam.spec(), p.Node.GlobalsDir()); err != nil {
					return err
				}
			}
			return nil
		},
		OnStop: func(cell.HookContext) error {
			p.Ops.close()
			return nil
		},
	})

	// The pins are the maps the reconciler writes (ops.go: checkPins).
	p.Jobs.Add(job.Timer("check-masq-map-pins", func(context.Context) error { return p.Ops.checkPins(p.Log) },
		p.Config.BPFMapRefreshInterval))

	statedb.Derive("derive-masq-map-entries",
		func(c *ipmasq.CIDR, deleted bool) (*MasqEntry, statedb.DeriveResult) {
			if deleted {
				return &MasqEntry{Prefix: c.Prefix}, statedb.DeriveDelete
			}
			return masqEntryFor(p.Log, v4, v6, c.Prefix), statedb.DeriveInsert
		})(p.Derive)

	_, err := reconciler.Register(
		p.Reconcile,
		p.Table,
		(*MasqEntry).Clone,
		(*MasqEntry).SetStatus,
		(*MasqEntry).GetStatus,
		p.Ops.ops,
		p.Ops.ops,
		reconcilerOptions(p.Config, "masq-map")...,
	)
	return err
}

// reconcilerOptions are the options every LPM map reconciler uses.
func reconcilerOptions(cfg Config, name string) []reconciler.Option {
	return []reconciler.Option{
		reconciler.WithName(name),
		reconciler.WithRetry(cfg.BPFMapRetryMin, cfg.BPFMapRetryMax),
		// Pruning only runs once the table is initialized, i.e. once its
		// source is: a restart never empties a map before the desired state
		// is loaded.
		reconciler.WithPruning(cfg.BPFMapRefreshInterval),
		reconciler.WithRefreshing(cfg.BPFMapRefreshInterval, rate.NewLimiter(rate.Limit(10000), 1000)),
		// The default limit (1000 rounds/s) is the floor of a change's
		// latency; batches make rounds cheap.
		reconciler.WithRoundLimits(1024, rate.NewLimiter(rate.Inf, 1)),
	}
}
