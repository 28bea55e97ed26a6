package source

import (
	"context"
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

// register fills both tables from the directory, or from the API server
// when the client is enabled, in one job (watch-policy-endpoints; the
// ClusterPolicyEndpoints report on its health scope ClusterScope). Each
// table has an initializer, done after the first read of the directory
// (with the API server: once its informer has synced), so that no consumer
// prunes against a partial state. With Settings.Off both tables are
// initialized and stay empty.
func register(p params) error {
	api := p.Client != nil && p.Client.IsEnabled()
	initName, clusterInitName := "policy-endpoints-dir", "cluster-policy-endpoints-dir"
	if api && p.Settings.Off == "" {
		initName, clusterInitName = "policy-endpoints-api", "cluster-policy-endpoints-api"
	}
	wtxn := p.DB.WriteTxn(p.Table, p.Clusters)
	initDone := p.Table.RegisterInitializer(wtxn, initName)
	clusterInitDone := p.Clusters.RegisterInitializer(wtxn, clusterInitName)
	if p.Settings.Off != "" {
		initDone(wtxn)
		clusterInitDone(wtxn)
		wtxn.Commit()
		p.Health.NewScope("policy").OK("No policy maps: " + p.Settings.Off)
		return nil
	}
	wtxn.Commit()

	s := newPolicySource(p.Settings, p.Node, filesource.Source[*PolicyEndpoint, string]{
		Log: p.Log, DB: p.DB, Table: p.Table, InitDone: initDone, Metrics: p.Metrics.source,
	}, filesource.Source[*ClusterPolicyEndpoint, string]{
		Log: p.Log, DB: p.DB, Table: p.Clusters, InitDone: clusterInitDone, Metrics: p.Metrics.cluster,
	}, p.Metrics.unknown)
	if api {
		if p.NodeIPs == nil {
			return fmt.Errorf("PolicyEndpoints from the API server need the %s table (nodeips.Cell) to tell the pods of this node", nodeips.TableName)
		}
		pes := newPolicyK8sSource(s, p.Client, p.NodeIPs)
		cpes := newClusterK8sSource(s, p.Client, p.NodeIPs)
		p.Jobs.Add(job.OneShot("watch-policy-endpoints", func(ctx context.Context, health cell.Health) error {
			done := make(chan struct{})
			go func() {
				defer close(done)
				cpes.run(ctx, health.NewScope(ClusterScope))
			}()
			err := pes.run(ctx, health)
			<-done
			return err
		}))
		return nil
	}
	p.Jobs.Add(job.OneShot("watch-policy-endpoints", s.Run))
	return nil
}
