package kernel

import (
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netns"
)

// Cell provides the kernel-links, kernel-addrs, kernel-routes and
// kernel-rules tables (read only: this cell alone writes them) and keeps
// them equal to the kernel with one netlink subscription. The kernel is the
// process's network namespace, or a *netns.NsHandle's when one is
// provided, or a Source's when one is provided (tests: a fake).
var Cell = cell.Module(
	"kernel",
	"Kernel links addresses routes and rules as tables",

	cell.ProvidePrivate(NewTables, newSource),
	cell.Provide(readTables),
	cell.Invoke(register),
)

// ReadTables are the tables as their readers get them.
type ReadTables struct {
	cell.Out

	Links  statedb.Table[*Link]
	Addrs  statedb.Table[*Addr]
	Routes statedb.Table[*Route]
	Rules  statedb.Table[*Rule]
}

func readTables(t *Tables) ReadTables {
	return ReadTables{Links: t.Links, Addrs: t.Addrs, Routes: t.Routes, Rules: t.Rules}
}

// source is the Source the cell reads (a private type: a provided Source
// is the cell's input).
type source struct{ Source }

type sourceParams struct {
	cell.In

	Lifecycle cell.Lifecycle
	// Source, when provided, is the kernel to read (tests).
	Source Source `optional:"true"`
	// NS, when provided, is the network namespace to read instead of the
	// agent's (tests).
	NS *netns.NsHandle `optional:"true"`
}

func newSource(p sourceParams) (source, error) {
	if p.Source != nil {
		return source{p.Source}, nil
	}
	nl, err := NewNetlink(p.NS)
	if err != nil {
		return source{}, err
	}
	p.Lifecycle.Append(cell.Hook{OnStop: func(cell.HookContext) error { nl.Close(); return nil }})
	return source{nl}, nil
}

type registerParams struct {
	cell.In

	Log       *slog.Logger
	DB        *statedb.DB
	Tables    *Tables
	Source    source
	Jobs      job.Group
	Lifecycle cell.Lifecycle
}

func register(p registerParams) {
	w := &watcher{log: p.Log, db: p.DB, tables: p.Tables, src: p.Source.Source, subscribed: make(chan struct{})}
	wtxn := p.DB.WriteTxn(p.Tables.Links, p.Tables.Addrs, p.Tables.Routes, p.Tables.Rules)
	inits := []func(statedb.WriteTxn){
		p.Tables.Links.RegisterInitializer(wtxn, "kernel"),
		p.Tables.Addrs.RegisterInitializer(wtxn, "kernel"),
		p.Tables.Routes.RegisterInitializer(wtxn, "kernel"),
		p.Tables.Rules.RegisterInitializer(wtxn, "kernel"),
	}
	wtxn.Commit()
	w.initDone = func(wtxn statedb.WriteTxn) {
		for _, done := range inits {
			done(wtxn)
		}
	}
	// Subscribed from a start hook: once the agent has started, no change
	// goes unseen.
	p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error { w.subscribe(); return nil }})
	p.Jobs.Add(job.OneShot("watch-kernel", w.run))
}
