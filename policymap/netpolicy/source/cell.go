package source

import (
	"fmt"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/cells/nodeips"
)

// Cell fills policy-endpoints from the PolicyEndpoint directory, or from
// the API server when the client is enabled. It takes Settings and the
// policy-endpoints table (package endpoints), and, with the API server, the
// node-ips table (nodeips.Cell).
var Cell = cell.Group(
	cell.ProvidePrivate(newSourceMetrics),
	cell.Provide((*sourceMetrics).collectors),
	cell.Invoke(register),
)

type params struct {
	cell.In

	Log      *slog.Logger
	Node     nodeconfig.Config
	Settings Settings
	DB       *statedb.DB
	Table    statedb.RWTable[*PolicyEndpoint]
	Jobs     job.Group
	Health   cell.Health
	Metrics  *sourceMetrics
	// Client, when enabled, makes the API server's PolicyEndpoints the
	// source instead of --policy-endpoints-path.
	Client *k8sclient.Client `optional:"true"`
	// NodeIPs are this node's addresses (the node rule of the API
	// source); needed with the API server only.
	NodeIPs statedb.Table[*nodeips.NodeIP] `optional:"true"`
}

// register fills policy-endpoints from the PolicyEndpoint directory, or
// from the API server when the client is enabled. With Settings.Off the
// table is initialized and stays empty.
func register(p params) error {
	api := p.Client != nil && p.Client.IsEnabled()
	initName := "policy-endpoints-dir"
	if api && p.Settings.Off == "" {
		initName = "policy-endpoints-api"
	}
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, initName)
	if p.Settings.Off != "" {
		initDone(wtxn)
		wtxn.Commit()
		p.Health.NewScope("policy").OK("No policy maps: " + p.Settings.Off)
		return nil
	}
	wtxn.Commit()

	s := newPolicySource(p.Settings, p.Node, filesource.Source[*PolicyEndpoint, string]{
		Log: p.Log, DB: p.DB, Table: p.Table, InitDone: initDone, Metrics: p.Metrics.source,
	})
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
