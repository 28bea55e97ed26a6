package ciliumnode

import (
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/metrics"
)

// Cell provides the enis table and keeps it in step with the CiliumNode (a
// file, or with the API server enabled the CiliumNode named after the
// node), and the ENIs' primary IPs in node-ips. It takes Settings.
var Cell = cell.Group(
	cell.ProvidePrivate(NewTable),
	cell.Provide(
		statedb.RWTable[*ENI].ToTable,
		newSourceMetrics,
	),
	cell.Invoke(
		registerSource,
		registerNodeIPs,
	),
)

type sourceParams struct {
	cell.In

	Settings Settings
	Log      *slog.Logger
	DB       *statedb.DB
	Table    statedb.RWTable[*ENI]
	Jobs     job.Group
	Health   cell.Health
	Metrics  *sourceMetrics
	// Client, when enabled, makes the API server's CiliumNode the source
	// instead of Settings.Path.
	Client *k8sclient.Client `optional:"true"`
}

func registerSource(p sourceParams) error {
	if p.Settings.Off != "" {
		wtxn := p.DB.WriteTxn(p.Table)
		p.Table.RegisterInitializer(wtxn, "ciliumnode")(wtxn)
		wtxn.Commit()
		p.Health.OK("Disabled: " + p.Settings.Off)
		return nil
	}
	if err := checkSource(p.Settings, p.Client); err != nil {
		return err
	}
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, "ciliumnode")
	wtxn.Commit()
	if p.Client != nil && p.Client.IsEnabled() {
		p.Jobs.Add(job.OneShot("watch-ciliumnode", newK8sSource(p, initDone).run))
		return nil
	}
	p.Jobs.Add(job.OneShot("watch-ciliumnode", newSource(p.Settings.Path, p, initDone).Run))
	return nil
}

// SourceName names the CiliumNode (file or API server) in the source metrics.
const SourceName = "ciliumnode"

// sourceMetrics are the CiliumNode source's metrics (metrics.Source).
type sourceMetrics struct{ source *metrics.Source }

func newSourceMetrics() (*sourceMetrics, metrics.Outs) {
	m := &sourceMetrics{source: metrics.NewSource(SourceName)}
	return m, metrics.Outs{Collectors: []prometheus.Collector{m.source}}
}
