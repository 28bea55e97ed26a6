package enforce

import (
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"
)

// Cell keeps the policy programs on the pods' devices. It takes Settings,
// SelectedPods and PolicyMaps, and provides the policy-attachments table.
var Cell = cell.Group(
	cell.ProvidePrivate(NewTable),
	cell.Provide(statedb.RWTable[*Attachment].ToTable),
	cell.Invoke(register),
)

type params struct {
	cell.In

	Log       *slog.Logger
	DB        *statedb.DB
	Settings  Settings
	Pods      SelectedPods
	Maps      PolicyMaps
	Table     statedb.RWTable[*Attachment]
	Jobs      job.Group
	Lifecycle cell.Lifecycle
	Reconcile reconciler.Params
}

func register(p params) error {
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, "policy-attachments")
	if p.Settings.Off != "" {
		initDone(wtxn)
		wtxn.Commit()
		if p.Settings.RemoveWhenOff {
			// Programs of an earlier run stay on the devices across
			// restarts: with enforcement off, they go.
			p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error {
				if err := removeAll(p.Settings.LinksDir); err != nil {
					p.Log.Warn("Could not take enimasq's policy programs off the pods' devices", "error", err)
				}
				return nil
			}})
		}
		return nil
	}
	wtxn.Commit()
	progs := &programs{settings: p.Settings, maps: p.Maps}
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			if err := progs.start(); err != nil {
				p.Log.Warn("Could not set the policy programs' mode yet", "error", err)
			}
			return nil
		},
		OnStop: func(cell.HookContext) error { progs.close(); return nil },
	})
	d := &deriver{log: p.Log, db: p.DB, table: p.Table, pods: p.Pods, settings: p.Settings, initDone: initDone}
	p.Jobs.Add(job.OneShot("derive-policy-attachments", d.run))
	_, err := reconciler.Register(
		p.Reconcile, p.Table,
		(*Attachment).Clone, (*Attachment).SetStatus, (*Attachment).GetStatus,
		&ops{log: p.Log, settings: p.Settings, progs: progs}, nil,
		reconciler.WithName("policy-attachments"),
		reconciler.WithRetry(p.Settings.CheckInterval/10, p.Settings.CheckInterval*10),
		reconciler.WithPruning(p.Settings.CheckInterval),
		// The refresh is the check against the kernel: a program detached
		// by hand is attached again within CheckInterval.
		reconciler.WithRefreshing(p.Settings.CheckInterval, rate.NewLimiter(rate.Inf, 1)),
	)
	return err
}
