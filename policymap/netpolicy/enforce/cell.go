package enforce

import (
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/enimasq/enimasq/cells/kernel"
)

// Cell keeps the policy programs on the pods' devices and every pod
// address bound to its device. It takes Settings, SelectedPods,
// PolicyMaps and the kernel-links and kernel-routes tables (cells/kernel),
// and provides the policy-attachments and policy-bindings tables and the
// API that a CNI ADD waits on (*API).
var Cell = cell.Group(
	cell.ProvidePrivate(NewTable, NewBindingsTable, newVerdicts),
	cell.Provide(
		statedb.RWTable[*Attachment].ToTable,
		statedb.RWTable[*Binding].ToTable,
		newAPI,
		newObservers,
	),
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
	Bindings  statedb.RWTable[*Binding]
	Jobs      job.Group
	Lifecycle cell.Lifecycle
	Reconcile reconciler.Params
	Observers *observers
	Links     statedb.Table[*kernel.Link]
	Routes    statedb.Table[*kernel.Route]
}

func register(p params) error {
	wtxn := p.DB.WriteTxn(p.Table, p.Bindings)
	attachmentsDone := p.Table.RegisterInitializer(wtxn, "policy-attachments")
	bindingsDone := p.Bindings.RegisterInitializer(wtxn, "policy-bindings")
	initDone := func(wtxn statedb.WriteTxn) {
		attachmentsDone(wtxn)
		bindingsDone(wtxn)
	}
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
	p.Observers.start(p.Jobs, progs)
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			if err := progs.start(); err != nil {
				p.Log.Warn("Could not set the policy programs' mode yet", "error", err)
			}
			return nil
		},
		OnStop: func(cell.HookContext) error { progs.close(); return nil },
	})
	d := &deriver{log: p.Log, db: p.DB, table: p.Table, bindings: p.Bindings, pods: p.Pods, settings: p.Settings,
		links: p.Links, routes: p.Routes, initDone: initDone}
	p.Jobs.Add(job.OneShot("derive-policy-attachments", d.run))
	o := &ops{log: p.Log, settings: p.Settings, progs: progs}
	// The links held open go at stop; their pins keep them attached.
	p.Lifecycle.Append(cell.Hook{OnStop: func(cell.HookContext) error { o.closeLinks(); return nil }})
	_, err := reconciler.Register(
		p.Reconcile, p.Table,
		(*Attachment).Clone, (*Attachment).SetStatus, (*Attachment).GetStatus,
		// Batches: the devices of a round forget their connections in
		// one walk of the connection-tracking map.
		o, o,
		reconciler.WithName("policy-attachments"),
		// A row in error is checked again within CheckInterval too (the
		// refresh only checks rows that are Done): a foreign program that
		// gets ahead again is seen as soon.
		reconciler.WithRetry(p.Settings.CheckInterval/10, p.Settings.CheckInterval),
		reconciler.WithPruning(p.Settings.CheckInterval),
		// The refresh is the check against the kernel: a program detached
		// by hand is attached again within CheckInterval.
		reconciler.WithRefreshing(p.Settings.CheckInterval, rate.NewLimiter(rate.Inf, 1)),
	)
	if err != nil {
		return err
	}
	// Every pod address bound to its device, attached or not: the
	// programs judge a local pod's address by the device it came from.
	bops := &bindingOps{log: p.Log, progs: progs}
	_, err = reconciler.Register(
		p.Reconcile, p.Bindings,
		(*Binding).Clone, (*Binding).SetStatus, (*Binding).GetStatus,
		// Batches: the addresses of a round (a node drained) forget their
		// connections in one walk of the connection-tracking map.
		bops, bops,
		reconciler.WithName("policy-bindings"),
		reconciler.WithRetry(p.Settings.CheckInterval/10, p.Settings.CheckInterval*10),
		reconciler.WithPruning(p.Settings.CheckInterval),
		reconciler.WithRefreshing(p.Settings.CheckInterval, rate.NewLimiter(rate.Inf, 1)),
	)
	return err
}
