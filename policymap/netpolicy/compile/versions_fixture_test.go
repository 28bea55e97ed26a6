package compile

import (
	"context"
	"log/slog"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// versionsFixture runs the switch of pods' versions (switch.go) over a
// deriver's tables, without maps: it plays the reconciler of
// policy-versions (a Pending row is Done at once) and, when asked, of the
// entries.
type versionsFixture struct {
	db       *statedb.DB
	versions statedb.RWTable[*PodVersions]
	entries  statedb.RWTable[*PolicyMapEntry]
	state    *policyVersions
	sw       *versionSwitch
}

func newVersionsFixture(t testing.TB, db *statedb.DB, eps statedb.Table[*endpoints.PolicyEndpoint], ents statedb.RWTable[*PolicyMapEntry]) *versionsFixture {
	t.Helper()
	vers, err := NewPolicyVersionsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := NewClusterMapEntriesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	cpes, err := endpoints.NewClusterPolicyEndpointsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(vers, cluster)
	initVersions := vers.RegisterInitializer(wtxn, "restore")
	cluster.RegisterInitializer(wtxn, "derive")(wtxn) // no ClusterPolicyEndpoints: initialized
	wtxn.Commit()
	state := newPolicyVersions(policymap.MapsParams{})
	if err := state.restore(); err != nil { // no map: nothing to restore
		t.Fatal(err)
	}
	wtxn = db.WriteTxn(vers)
	initVersions(wtxn)
	wtxn.Commit()
	state.markReady()
	return &versionsFixture{db: db, versions: vers, entries: ents, state: state,
		sw: &versionSwitch{log: slog.New(slog.DiscardHandler), db: db, versions: vers, policy: ents, cluster: cluster,
			pes: eps, cpes: cpes, state: state}}
}

// run runs the switch and the reconciler of policy-versions (with entries,
// of policy-map-entries too) until ctx is done.
func (f *versionsFixture) run(ctx context.Context, entries bool) error {
	go f.sw.run(ctx, &celltest.Health{})
	wtxn := f.db.WriteTxn(f.versions, f.entries)
	vc, err := f.versions.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return err
	}
	ec, err := f.entries.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return err
	}
	for {
		txn := f.db.ReadTxn()
		vb, vw := vc.Next(txn)
		eb, ew := ec.Next(txn)
		wtxn := f.db.WriteTxn(f.versions, f.entries)
		for c := range vb {
			if !c.Deleted && c.Object.Status.Kind == reconciler.StatusKindPending {
				f.versions.CompareAndSwap(wtxn, c.Revision, c.Object.Clone().SetStatus(reconciler.StatusDone()))
			}
		}
		for c := range eb {
			if entries && !c.Deleted && c.Object.Status.Kind == reconciler.StatusKindPending {
				f.entries.CompareAndSwap(wtxn, c.Revision, c.Object.Clone().SetStatus(reconciler.StatusDone()))
			}
		}
		wtxn.Commit()
		select {
		case <-vw:
		case <-ew:
		case <-ctx.Done():
			return nil
		}
	}
}
