package compile

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
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
	versions statedb.RWTable[*PodVersions] // see policyDeriver.versions
	state    *policyVersions
	node     nodeconfig.Config
	initDone func(statedb.WriteTxn)

	changed *changedPods[*endpoints.ClusterPolicyEndpoint]
	unions  *unions[*endpoints.ClusterPolicyEndpoint]
}

func (d *clusterDeriver) run(ctx context.Context, health cell.Health) error {
	if !d.state.wait(ctx) { // version numbers go on from an earlier run's
		return nil
	}
	wtxn := d.db.WriteTxn(d.cpes, d.versions)
	changes, err := d.cpes.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return fmt.Errorf("watch %s: %w", endpoints.ClusterPolicyEndpointsTableName, err)
	}
	defer changes.Close()
	versionChanges, err := d.versions.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("watch %s: %w", PolicyVersionsTableName, err)
	}
	defer versionChanges.Close()
	d.changed = newChangedPods(d.cpes, endpoints.ClusterPolicyEndpointParentIndex)
	d.unions = newUnions(d.cpes, endpoints.ClusterPolicyEndpointParentIndex)
	for {
		txn := d.db.ReadTxn()
		batch, watch := changes.Next(txn)
		affected := d.changed.affected(txn, batch, nil)
		// Pods whose last switch is in the kernel are recompiled: the
		// version it replaced goes (versionDiff).
		vbatch, versionWatch := versionChanges.Next(txn)
		for _, p := range needsCleanup(vbatch, bpf.TierCluster) {
			affected[p] = struct{}{}
		}
		var initWatch <-chan struct{}
		if len(affected) > 0 || d.initDone != nil {
			wtxn := d.db.WriteTxn(d.entries, d.versions)
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
		case <-versionWatch:
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
	// The rows are read in a snapshot (wtxn holds the table's lock).
	before := d.db.ReadTxn()
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
		tv, done := tierOf(wtxn, d.versions, pod, bpf.TierCluster)
		fresh, stale, next, changed := versionDiff(clusterPodRows(before, d.entries, pod), tv, done, desired,
			func() uint32 { return d.state.alloc(d.log) })
		if !changed {
			continue
		}
		for _, e := range stale {
			d.entries.Delete(wtxn, e)
		}
		for _, e := range fresh {
			d.entries.Insert(wtxn, e)
		}
		if next != tv {
			setTier(wtxn, d.versions, pod, bpf.TierCluster, next)
		}
		written += len(stale) + len(fresh)
	}
	return written
}

// clusterPodRows are a pod's cluster rows in txn.
func clusterPodRows(txn statedb.ReadTxn, table statedb.Table[*ClusterMapEntry], pod netip.Addr) iter.Seq[*ClusterMapEntry] {
	return func(yield func(*ClusterMapEntry) bool) {
		for e := range table.Prefix(txn, ClusterPodEntries(pod)) {
			if !yield(e) {
				return
			}
		}
	}
}
