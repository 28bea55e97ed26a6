package allocator

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/enimasq/enimasq/ipam/allocations"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// The allocator's state across restarts and ENI changes: the checkpoint,
// written before each change is committed, restored at start, and each
// allocation's ENI and state kept in step with the pool.

// writeCheckpoint writes the allocations of txn to the checkpoint, and says
// in health whether it could.
func (a *Allocator) writeCheckpoint(txn statedb.ReadTxn) error {
	var entries []CheckpointEntry
	for al := range a.allocs.All(txn) {
		entries = append(entries, CheckpointEntry{IP: al.IP, Owner: al.Owner, PodUID: al.PodUID,
			Network: al.Attachment.Network, ContainerID: al.Attachment.ContainerID, IfName: al.Attachment.IfName, V1: al.V1})
	}
	if err := WriteCheckpoint(a.checkpoint, entries); err != nil {
		a.log.Error("Cannot write the allocations checkpoint: change refused", "error", err)
		if a.checkpointHealth != nil {
			a.checkpointHealth.Degraded("cannot write the allocations checkpoint: allocations and releases are refused", err)
		}
		return err
	}
	if a.checkpointHealth != nil {
		a.checkpointHealth.OK("written: " + a.checkpoint)
	}
	return nil
}

// restore loads the checkpoint into the table and marks it initialized. A
// checkpoint that cannot be read is retried: until then nothing is
// allocated, released or pruned.
func (a *Allocator) restore(ctx context.Context, health cell.Health) error {
	lastErr := ""
	for {
		entries, err := ReadCheckpoint(a.checkpoint)
		if err == nil {
			removeStaleTemps(a.checkpoint)
			a.mu.Lock()
			wtxn := a.db.WriteTxn(a.allocs)
			for _, e := range entries {
				a.allocs.Insert(wtxn, &allocations.Allocation{IP: e.IP.Unmap(), Owner: e.Owner, PodUID: e.PodUID, Attachment: e.attachment(), V1: e.V1, State: allocations.StateRestored})
			}
			a.restoreDone(wtxn)
			wtxn.Commit()
			a.mu.Unlock()
			a.log.Info("Restored allocations", "checkpoint", a.checkpoint, "allocations", len(entries))
			if a.checkpointHealth != nil {
				// OK from the start: a write failure turns it Degraded.
				a.checkpointHealth.OK(fmt.Sprintf("restored %d allocations from %s", len(entries), a.checkpoint))
			}
			return nil
		}
		if err.Error() != lastErr {
			lastErr = err.Error()
			a.log.Error("Cannot read the allocations checkpoint: no allocation, release or pruning until it is fixed or removed", "error", err)
		}
		health.Degraded("cannot read the allocations checkpoint", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(a.retry):
		}
	}
}

// syncPool keeps the ENI and state of every allocation in step with the
// pool, and reports allocations whose IP has left it (their rules are
// removed by the desired-state job, which reads the pool itself).
func (a *Allocator) syncPool(ctx context.Context, health cell.Health) error {
	reported := map[netip.Addr]bool{}
	for {
		rtxn := a.db.ReadTxn()
		_, enisWatch := a.enis.AllWatch(rtxn)
		_, allocsWatch := a.allocs.AllWatch(rtxn)
		if ok, initWatch := a.enis.Initialized(rtxn); !ok {
			select {
			case <-ctx.Done():
				return nil
			case <-initWatch:
				continue
			}
		}

		wtxn := a.db.WriteTxn(a.allocs)
		pool := a.pool(wtxn)
		var orphans []string
		orphaned := map[netip.Addr]bool{}
		total := 0
		for al := range a.allocs.All(wtxn) {
			total++
			eni, state, reason := placement(pool, al)
			if eni != al.ENI || state != al.State || reason != al.Reason {
				next := *al
				next.ENI, next.State, next.Reason = eni, state, reason
				a.allocs.Insert(wtxn, &next)
			}
			if state == allocations.StateOrphaned {
				orphans = append(orphans, fmt.Sprintf("%s (%s)", al.IP, al.Owner))
				orphaned[al.IP] = true
				if !reported[al.IP] {
					a.log.Warn("Allocation has left the pool: its rules are removed; release it",
						"ip", al.IP, "owner", al.Owner, "reason", reason)
				}
			}
		}
		wtxn.Commit()
		reported = orphaned

		if len(orphans) > 0 {
			slices.Sort(orphans)
			health.Degraded(fmt.Sprintf("%d of %d allocations are not in the pool", len(orphans), total),
				fmt.Errorf("not in the pool (rules removed, release them): %s", strings.Join(orphans, ", ")))
		} else {
			health.OK(fmt.Sprintf("%d allocations, all in the pool of %d addresses", total, pool.Len()))
		}

		select {
		case <-ctx.Done():
			return nil
		case <-enisWatch:
		case <-allocsWatch:
		}
	}
}
