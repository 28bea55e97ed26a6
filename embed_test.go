package enimasq_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq"
	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/bpffake"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipam/netlinkfake"
)

// featureTables are the tables the feature cells register.
var featureTables = []string{"node-ips", "ip-masq-agent-cidrs", "masq-map-entries", "enis", "ipam-allocations", "eni-rules", "eni-routes", "policy-endpoints", "policy-map-entries", "policy-attachments", "policy-bindings"}

// TestFeaturesEmbedInAForeignHive builds the feature cells into a hive the way
// a Cilium-based agent would: its own statedb, jobs and health, a job.Group
// per module, and nodeconfig.Config from its own configuration. No enimasq
// infrastructure cell is linked. The maps and the netlink of the ENI IPAM
// are fakes (as the embedding agent's tests would have them), so it runs
// as any user.
func TestFeaturesEmbedInAForeignHive(t *testing.T) {
	opts := hive.DefaultOptions()
	opts.ModulePrivateProviders = cell.ModulePrivateProviders{
		func(reg job.Registry, h cell.Health) job.Group { return reg.NewGroup(h) },
	}
	var db *statedb.DB
	h := hive.NewWithOptions(opts,
		statedb.Cell,
		job.Cell,
		cell.SimpleHealthCell,
		cell.Provide(func() nodeconfig.Config {
			return nodeconfig.Config{
				EnableIPv4: true,
				BPFRoot:    t.TempDir(),
				StateDir:   t.TempDir(),
				IPAM:       nodeconfig.IPAM{Mode: nodeconfig.IPAMModeENI},
			}
		}),
		cell.Provide(
			func() bpf.MapStore { return bpffake.NewFakeStore() },
		),
		netlinkfake.New().Cells(),
		enimasq.Features,
		cell.Invoke(func(d *statedb.DB) { db = d }),
	)
	log := hivetest.Logger(t, hivetest.LogLevel(slog.LevelInfo))
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start: %s", err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Errorf("stop: %s", err)
		}
	})

	txn := db.ReadTxn()
	var names []string
	for _, tbl := range db.GetTables(txn) {
		names = append(names, tbl.Name())
	}
	for _, want := range featureTables {
		if !slices.Contains(names, want) {
			t.Errorf("table %q not registered; have %v", want, names)
		}
	}
}
