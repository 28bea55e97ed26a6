package compile

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/cells/tablesync"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// clusterDeriver keeps cluster-policy-map-entries equal to the compilation
// of cluster-policy-endpoints. On a change it recompiles the pod IPs that
// the changed objects list (before and after) and writes only the entries
// whose bytes differ. ClusterPolicyEndpoints are few and small next to
// PolicyEndpoints: pods of one selection share a compilation within a
// round, and a round is one transaction. It runs apart from the
// PolicyEndpoint deriver: neither waits for the other's table (an API
// server without the ClusterPolicyEndpoint CRD never holds up
// PolicyEndpoints).
type clusterDeriver struct {
	log      *slog.Logger
	db       *statedb.DB
	cpes     statedb.Table[*endpoints.ClusterPolicyEndpoint]
	entries  statedb.RWTable[*ClusterMapEntry]
	node     nodeconfig.Config
	initDone func(statedb.WriteTxn)

	changed *changedPods[*endpoints.ClusterPolicyEndpoint]
	unions  *unions[*endpoints.ClusterPolicyEndpoint]
}

func (d *clusterDeriver) run(ctx context.Context, health cell.Health) error {
	wtxn := d.db.WriteTxn(d.cpes)
	changes, err := d.cpes.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("watch %s: %w", endpoints.ClusterPolicyEndpointsTableName, err)
	}
	defer changes.Close()
	d.changed = newChangedPods(d.cpes, endpoints.ClusterPolicyEndpointParentIndex)
	d.unions = newUnions(d.cpes, endpoints.ClusterPolicyEndpointParentIndex)
	for {
		txn := d.db.ReadTxn()
		batch, watch := changes.Next(txn)
		affected := d.changed.affected(txn, batch, nil)
		var initWatch <-chan struct{}
		if len(affected) > 0 || d.initDone != nil {
			wtxn := d.db.WriteTxn(d.entries)
			written := d.work(wtxn, sortedAddrs(affected))
			if d.initDone != nil {
				if ok, ch := d.cpes.Initialized(wtxn); ok {
					d.initDone(wtxn)
					d.initDone = nil
					health.OK(fmt.Sprintf("Initialized: %d entries", d.entries.NumObjects(wtxn)))
				} else {
					initWatch = ch
				}
			} else if len(affected) > 0 {
				health.OK(fmt.Sprintf("%d pod IPs recompiled, %d entries written", len(affected), written))
			}
			wtxn.Commit()
		}
		select {
		case <-watch:
		case <-initWatch:
		case <-ctx.Done():
			return nil
		}
	}
}

// work recompiles the pods and writes their entries; it returns how many
// entries it wrote or deleted.
func (d *clusterDeriver) work(wtxn statedb.WriteTxn, pods []netip.Addr) int {
	templates := map[string][]*policyTemplate{}
	d.unions.reset()
	written := 0
	for _, pod := range pods {
		var desired []*ClusterMapEntry
		if d.node.FamilyEnabled(pod) {
			listing := statedb.Collect(d.cpes.List(wtxn, endpoints.ClusterPolicyEndpointPodIndex.Query(pod)))
			if sel, ok := clusterSelectionOf(pod, d.unions.of(wtxn, listing), listing); ok {
				k := sel.key()
				ts, ok := templates[k]
				if !ok {
					ts = compileClusterSelection(sel)
					templates[k] = ts
				}
				for _, t := range ts {
					desired = t.stampCluster(desired, pod)
				}
			}
		}
		written += clusterRows.SyncSubset(wtxn, d.entries, d.entries.Prefix(wtxn, ClusterPodEntries(pod)), desired)
	}
	return written
}

// clusterRows are the cluster-policy-map-entries rows as the deriver writes
// them: compared without their status, new and changed ones Pending.
var clusterRows = tablesync.Rows[*ClusterMapEntry, PolicyEntryKey]{
	Key:    (*ClusterMapEntry).Key,
	Query:  ClusterEntryIndex.Query,
	Same:   (*ClusterMapEntry).sameDesired,
	Insert: func(e *ClusterMapEntry) *ClusterMapEntry { return e.SetStatus(reconciler.StatusPending()) },
}
