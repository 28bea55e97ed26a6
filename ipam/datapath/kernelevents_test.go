package datapath

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/ipamapi"
	"github.com/enimasq/enimasq/ipam/ipamtest"
)

// TestRuleRepairDeletionBeforeDone: a pod's rule deleted by someone else
// while the reconciler has added it but not yet marked its row Done (a
// just-allocated pod) is put back as the row turns Done: the deletion is
// remembered until the kernel holds the rule again.
func TestRuleRepairDeletionBeforeDone(t *testing.T) {
	db := statedb.New()
	kt, err := kernel.NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := NewRuleTable(db)
	if err != nil {
		t.Fatal(err)
	}
	n, nonMasq := ipamtest.Samples(t)
	ip := netip.MustParseAddr("10.130.100.133")
	eni, _ := ciliumnode.NewPool(n.ENIs).ENI(ip)
	row := PodRules(ip, "shop/web", eni, ciliumnode.ResultCIDRs(eni, ipamapi.FamilyIPv4, nil, nonMasq), sampleSettings)[0]

	r := &ruleRepair{log: slog.New(slog.DiscardHandler), db: db, rules: rules, families: []int{netlink.FAMILY_V4},
		settings: sampleSettings, kernel: kernelTables{Rules: kt.Rules, Routes: kt.Routes, Links: kt.Links},
		deleted: map[RuleKey]struct{}{}}
	if err := r.follow(); err != nil {
		t.Fatal(err)
	}
	// The reconciler has added the rule; its row is still Pending.
	kr := &kernel.Rule{Rule: *netlinkRule(row.RuleKey, netlink.FAMILY_V4, sampleSettings.PodRules.Protocol), ID: "the pod's rule"}
	wtxn := db.WriteTxn(kt.Rules, rules)
	kt.Rules.Insert(wtxn, kr)
	rules.Insert(wtxn, row.Clone().SetStatus(reconciler.StatusPending()))
	wtxn.Commit()
	r.changes(db.ReadTxn())

	status := func() reconciler.StatusKind {
		got, _, _ := rules.Get(db.ReadTxn(), RuleKeyIndex.Query(row.RuleKey))
		return got.Status.Kind
	}
	// Someone deletes it: nothing to repair yet (the row is not Done).
	wtxn = db.WriteTxn(kt.Rules)
	kt.Rules.Delete(wtxn, kr)
	wtxn.Commit()
	if c := r.changes(db.ReadTxn()); !c.ruleDeleted {
		t.Fatal("the deletion is not seen")
	}
	n0, watch := r.repair(false)
	if n0 != 0 || watch == nil {
		t.Fatalf("repair with the row Pending: %d rows, watch %v; want 0 rows and a watch of eni-rules", n0, watch)
	}

	// The reconciler marks the row Done: the repair looks again.
	wtxn = db.WriteTxn(rules)
	rules.Insert(wtxn, row.Clone().SetStatus(reconciler.StatusDone()))
	wtxn.Commit()
	select {
	case <-watch:
	case <-time.After(5 * time.Second):
		t.Fatal("the row turned Done and the watch did not fire")
	}
	if n1, _ := r.repair(true); n1 != 1 || status() != reconciler.StatusKindPending {
		t.Fatalf("repair after the row turned Done: %d rows, status %s; want 1, Pending", n1, status())
	}

	// The reconciler adds it back: the deletion is forgotten.
	wtxn = db.WriteTxn(kt.Rules, rules)
	kt.Rules.Insert(wtxn, kr)
	rules.Insert(wtxn, row.Clone().SetStatus(reconciler.StatusDone()))
	wtxn.Commit()
	r.changes(db.ReadTxn())
	if n2, watch := r.repair(false); n2 != 0 || watch != nil || len(r.deleted) != 0 {
		t.Fatalf("repair with the rule back: %d rows, watch %v, deleted %v; want none", n2, watch, r.deleted)
	}
}
