package infra

import (
	"log/slog"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/metrics"
)

// Infrastructure is what every feature cell needs and what an embedding agent
// (any Cilium-based agent) already has: statedb, the job registry, health,
// reconciler metrics, the hive shell and the agent API. Feature cells never
// depend on this cell, only on the objects it provides.
var Infrastructure = cell.Group(
	nodeCell, // first: its invoke takes the agent lock before anything starts
	Core,
	shellCell,
	apiCell,
	metricsServerCell,
	k8sclient.Cell,
)

// Core is the part of Infrastructure that script tests share with the agent:
// statedb, jobs, health with its `health` command, reconciler metrics, and
// the Prometheus registry with its `metrics` command.
var Core = cell.Group(
	statedb.Cell,
	job.Cell,
	cell.Provide(
		NewHealthRegistry,
		func(r *HealthRegistry) cell.Health { return r.Root() },
		healthCommand,
		// Unpublished: the agent API serves them at /debug/vars, and tests may
		// run several hives in one process.
		reconciler.NewUnpublishedExpVarMetrics,
		metrics.NewReconciler,
		func(e *reconciler.ExpVarMetrics, p *metrics.Reconciler) reconciler.Metrics { return teeMetrics{e, p} },
		newRegistry,
		metricsCommand,
	),
)

// LogThreshold is how long an invoke or a start or stop hook may take
// before hive logs it at INFO.
const LogThreshold = 100 * time.Millisecond

// HiveOptions scopes health and a job.Group to each module, the way Cilium's
// hive does: a feature cell asks for job.Group and cell.Health and gets its own.
func HiveOptions() hive.Options {
	opts := hive.DefaultOptions()
	// The lifecycle takes its threshold here, when the hive is built
	// (hive.WithLogThreshold given to Run reaches only the invokes): a start
	// or stop hook faster than this logs at DEBUG, not INFO.
	opts.LogThreshold = LogThreshold
	opts.ModuleDecorators = cell.ModuleDecorators{
		// The decorated Health of a parent module is the input of its
		// child's decorator: scopes nest as "parent.child".
		func(h cell.Health, id cell.ModuleID) cell.Health {
			return h.NewScope(string(id))
		},
	}
	opts.ModulePrivateProviders = cell.ModulePrivateProviders{
		func(reg job.Registry, h cell.Health, log *slog.Logger, id cell.ModuleID) job.Group {
			return reg.NewGroup(h, job.WithLogger(log))
		},
	}
	return opts
}

// New builds a hive of the given cells with HiveOptions.
func New(cells ...cell.Cell) *hive.Hive {
	return hive.NewWithOptions(HiveOptions(), cells...)
}
