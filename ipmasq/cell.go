package ipmasq

import (
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
)

// Cell provides Table[*CIDR] (ip-masq-agent-cidrs) and keeps it in step with
// the ip-masq-agent config file. With --enable-ip-masq-agent=false the table
// exists, is initialized and stays empty.
var Cell = cell.Module(
	"ipmasq",
	"ip-masq-agent non-masquerade CIDRs",

	cell.Config(DefaultConfig),
	cell.ProvidePrivate(NewTable),
	cell.Provide(statedb.RWTable[*CIDR].ToTable),
	cell.Invoke(registerSource),
)

type sourceParams struct {
	cell.In

	Config Config
	Log    *slog.Logger
	DB     *statedb.DB
	Table  statedb.RWTable[*CIDR]
	Jobs   job.Group
	Health cell.Health
}

func registerSource(p sourceParams) error {
	if err := p.Config.Validate(); err != nil {
		return err
	}
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, "ip-masq-agent-config")
	if !p.Config.EnableIPMasqAgent {
		initDone(wtxn)
		wtxn.Commit()
		p.Health.OK("Disabled (--enable-ip-masq-agent=false)")
		return nil
	}
	wtxn.Commit()

	s := &source{
		path:     p.Config.IPMasqAgentConfigPath,
		resync:   p.Config.IPMasqAgentResyncInterval,
		log:      p.Log,
		db:       p.DB,
		table:    p.Table,
		initDone: initDone,
	}
	p.Jobs.Add(job.OneShot("watch-config", s.run))
	return nil
}
