package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// policyDeriver keeps policy-map-entries equal to the compilation of
// policy-endpoints. On a change it recompiles only the pod IPs that the
// changed objects list (before and after the change) and writes only the
// entries whose bytes differ: an unchanged entry keeps its revision, so the
// reconciler does nothing for it.
type policyDeriver struct {
	log       *slog.Logger
	db        *statedb.DB
	endpoints statedb.Table[*PolicyEndpoint]
	entries   statedb.RWTable[*PolicyMapEntry]
	node      nodeconfig.Config
	// initDone marks policy-map-entries initialized; called once
	// policy-endpoints is initialized and its contents are compiled, so the
	// reconciler never prunes the maps against a partial desired state.
	initDone func(statedb.WriteTxn)

	// podsOf holds, per object key, the pod IPs it listed when last seen:
	// a change or deletion must also recompile the pods it no longer lists.
	podsOf map[string][]netip.Addr

	metrics *policyMetrics
}

// run follows the changes of policy-endpoints until ctx is done.
func (d *policyDeriver) run(ctx context.Context, health cell.Health) error {
	wtxn := d.db.WriteTxn(d.endpoints)
	changes, err := d.endpoints.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("watch %s: %w", PolicyEndpointsTableName, err)
	}
	defer changes.Close()
	if d.podsOf == nil {
		d.podsOf = map[string][]netip.Addr{}
	}

	for {
		var initWatch <-chan struct{}
		wtxn := d.db.WriteTxn(d.entries)
		batch, watch := changes.Next(wtxn)
		affected := map[netip.Addr]struct{}{}
		for change := range batch {
			key := change.Object.Key()
			for _, pod := range d.podsOf[key] {
				affected[pod] = struct{}{}
			}
			if change.Deleted {
				delete(d.podsOf, key)
				continue
			}
			pods := make([]netip.Addr, 0, len(change.Object.Pods))
			for _, p := range change.Object.Pods {
				pods = append(pods, p.PodIP)
				affected[p.PodIP] = struct{}{}
			}
			d.podsOf[key] = pods
		}
		written := 0
		start := time.Now()
		for _, pod := range sortedAddrs(affected) {
			written += d.syncPod(wtxn, pod)
		}
		if len(affected) > 0 {
			d.metrics.compiled(time.Since(start))
		}
		if d.initDone != nil {
			if ok, ch := d.endpoints.Initialized(wtxn); ok {
				d.initDone(wtxn)
				d.initDone = nil
				n := d.entries.NumObjects(wtxn)
				d.log.Info("Policy map entries initialized", "entries", n)
				health.OK(fmt.Sprintf("Initialized: %d entries", n))
			} else {
				initWatch = ch
			}
		}
		wtxn.Commit()
		if len(affected) > 0 {
			d.log.Debug("Compiled policy map entries", "pods", len(affected), "entries-written", written)
			d.report(health, fmt.Sprintf("%d pod IPs recompiled, %d entries written", len(affected), written))
		}

		select {
		case <-watch:
		case <-initWatch:
		case <-ctx.Done():
			return nil
		}
	}
}

// report sets health: Degraded, naming a few, while entries cannot be
// encoded (they deny: fail closed), OK otherwise.
func (d *policyDeriver) report(health cell.Health, ok string) {
	var bad []string
	n := 0
	for e := range d.entries.All(d.db.ReadTxn()) {
		if e.Error == "" {
			continue
		}
		if n++; len(bad) < 3 {
			bad = append(bad, fmt.Sprintf("%s %s %s: %s", e.Map, e.Pod, e.Peer, e.Error))
		}
	}
	if n > 0 {
		health.Degraded(fmt.Sprintf("%d policy map entries cannot be encoded and deny (fail closed)", n),
			errors.New(strings.Join(bad, "; ")))
		return
	}
	health.OK(ok)
}

// syncPod recompiles one pod IP and writes the difference. It returns the
// number of entries inserted, changed or deleted.
func (d *policyDeriver) syncPod(wtxn statedb.WriteTxn, pod netip.Addr) int {
	var desired []*PolicyMapEntry
	if d.node.FamilyEnabled(pod) && !pod.Is4In6() {
		pes := statedb.Collect(d.endpoints.List(wtxn, PolicyEndpointPodIndex.Query(pod)))
		desired = CompilePod(pod, pes)
	}
	return syncEntries(wtxn, d.entries, pod, desired)
}

// entryRows are the policy-map-entries rows, as the deriver writes them:
// compared without their status, new and changed ones Pending.
var entryRows = tablesync.Rows[*PolicyMapEntry, PolicyEntryKey]{
	Key:    (*PolicyMapEntry).Key,
	Query:  PolicyEntryIndex.Query,
	Same:   (*PolicyMapEntry).sameDesired,
	Insert: func(e *PolicyMapEntry) *PolicyMapEntry { return e.SetStatus(reconciler.StatusPending()) },
}

// syncEntries makes the pod IP's entries in table equal to desired,
// writing only what differs; new and changed entries are pending.
func syncEntries(wtxn statedb.WriteTxn, table statedb.RWTable[*PolicyMapEntry], pod netip.Addr, desired []*PolicyMapEntry) int {
	return entryRows.SyncSubset(wtxn, table, table.List(wtxn, PolicyEntryPodIndex.Query(pod)), desired)
}

func sortedAddrs(set map[netip.Addr]struct{}) []netip.Addr {
	out := make([]netip.Addr, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
