package source

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/cells/nodeips"
)

// Cell fills policy-endpoints and cluster-policy-endpoints from the
// PolicyEndpoint directory (which holds both kinds), or from the API server
// when the client is enabled. It takes Settings and both tables (package
// endpoints), and, with the API server, the node-ips table (nodeips.Cell).
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
	Clusters statedb.RWTable[*ClusterPolicyEndpoint]
	Jobs     job.Group
	Health   cell.Health
	Metrics  *sourceMetrics
	// Client, when enabled, makes the API server's PolicyEndpoints and
	// ClusterPolicyEndpoints the source instead of --policy-endpoints-path.
	Client *k8sclient.Client `optional:"true"`
	// NodeIPs are this node's addresses (the node rule of the API
	// source); needed with the API server only.
	NodeIPs statedb.Table[*nodeips.NodeIP] `optional:"true"`
}

// register fills every kind's table from the directory, or from the API
// server when the client is enabled, in one job (watch-policy-endpoints;
// each kind but the first reports on its health scope, ClusterScope).
// Each table has an initializer, done after the first read of the
// directory (with the API server: once its informer has synced), so that
// no consumer prunes against a partial state. With Settings.Off the tables
// are initialized and stay empty.
func register(p params) error {
	api := p.Client != nil && p.Client.IsEnabled()
	tables := []kindTable{ // in the order of kinds
		newTable(policyEndpoints, filesource.Source[*PolicyEndpoint, string]{Log: p.Log, DB: p.DB, Table: p.Table, Metrics: p.Metrics.source}),
		newTable(clusterPolicyEndpoints, filesource.Source[*ClusterPolicyEndpoint, string]{Log: p.Log, DB: p.DB, Table: p.Clusters, Metrics: p.Metrics.cluster}),
	}
	initSuffix := "-dir"
	if api && p.Settings.Off == "" {
		initSuffix = "-api"
	}
	metas := make([]statedb.TableMeta, len(tables))
	for i, t := range tables {
		metas[i] = t.meta()
	}
	wtxn := p.DB.WriteTxn(metas...)
	for _, t := range tables {
		t.registerInitializer(wtxn, t.meta().Name()+initSuffix)
	}
	if p.Settings.Off != "" {
		for _, t := range tables {
			t.initDone(wtxn)
		}
		wtxn.Commit()
		p.Health.NewScope("policy").OK("No policy maps: " + p.Settings.Off)
		return nil
	}
	wtxn.Commit()

	s := newPolicySource(p.Settings, p.Node, p.Metrics.unknown, tables...)
	if !api {
		p.Jobs.Add(job.OneShot("watch-policy-endpoints", s.Run))
		return nil
	}
	if p.NodeIPs == nil {
		return fmt.Errorf("PolicyEndpoints from the API server need the %s table (nodeips.Cell) to tell the pods of this node", nodeips.TableName)
	}
	p.Jobs.Add(job.OneShot("watch-policy-endpoints", func(ctx context.Context, health cell.Health) error {
		var wg sync.WaitGroup
		for _, t := range tables {
			h := t.health(health)
			wg.Go(func() { t.watchAPI(ctx, h, p.Client, p.NodeIPs) })
		}
		wg.Wait()
		return nil
	}))
	return nil
}
