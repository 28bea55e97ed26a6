package cells_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// TestFeaturesEmbedInAForeignHive builds the feature cells into a hive the way
// a Cilium-based agent would: its own statedb, jobs and health, a job.Group
// per module, and nodeconfig.Config from its own configuration. No enimasq
// infrastructure cell is linked.
func TestFeaturesEmbedInAForeignHive(t *testing.T) {
	opts := hive.DefaultOptions()
	opts.ModulePrivateProviders = cell.ModulePrivateProviders{
		func(reg job.Registry, h cell.Health) job.Group { return reg.NewGroup(h) },
	}
	h := hive.NewWithOptions(opts,
		statedb.Cell,
		job.Cell,
		cell.SimpleHealthCell,
		cell.Provide(func() nodeconfig.Config {
			return nodeconfig.Config{
				EnableIPv4: true,
				BPFRoot:    celltest.PrivateBPFFS(t),
				StateDir:   t.TempDir(),
			}
		}),
		cells.Features,
	)
	log := hivetest.Logger(t, hivetest.LogLevel(slog.LevelInfo))
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start: %s", err)
	}
	if err := h.Stop(log, context.Background()); err != nil {
		t.Fatalf("stop: %s", err)
	}
}
