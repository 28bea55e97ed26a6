package ipmasq

import (
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/metrics"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// Cell provides Table[*CIDR] (ip-masq-agent-cidrs) and keeps it in step with
// the ip-masq-agent config file. With --enable-ip-masq-agent=false the table
// exists, is initialized and stays empty. Its settings are
// nodeconfig.IPMasqAgent, owned by the embedding agent.
var Cell = cell.Module(
	"ipmasq",
	"ip-masq-agent non-masquerade CIDRs",

	cell.Config(DefaultConfig),
	cell.ProvidePrivate(
		NewTable,
		func() *metrics.Source { return metrics.NewSource(SourceName) },
	),
	cell.Provide(
		statedb.RWTable[*CIDR].ToTable,
		func(m *metrics.Source) metrics.Out { return metrics.Out{Collector: m} },
	),
	cell.Invoke(registerSource),
)

type sourceParams struct {
	cell.In

	Node    nodeconfig.Config
	Config  Config
	Log     *slog.Logger
	DB      *statedb.DB
	Table   statedb.RWTable[*CIDR]
	Jobs    job.Group
	Health  cell.Health
	Metrics *metrics.Source
}

// SourceName names the ip-masq-agent file in the source metrics.
const SourceName = "ip-masq-agent"

func registerSource(p sourceParams) error {
	agent := p.Node.IPMasqAgent
	if err := agent.Validate(p.Node.Masquerade); err != nil {
		return err
	}
	if err := p.Config.validate(); err != nil {
		return err
	}
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, "ip-masq-agent-config")
	if !agent.Enabled {
		initDone(wtxn)
		wtxn.Commit()
		p.Health.OK("Disabled (--enable-ip-masq-agent=false)")
		return nil
	}
	wtxn.Commit()

	p.Jobs.Add(job.OneShot("watch-config", newSource(p, initDone).Run))
	return nil
}
