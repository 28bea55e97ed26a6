package ipmasq

import (
	"cmp"
	"errors"
	"io/fs"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// ReadFile reads and parses the config file at path. A missing file (or a
// dangling ConfigMap symlink, or a missing directory) gives the defaults.
func ReadFile(path string) (Desired, error) {
	data, err := filewatch.ReadRegular(path, MaxFileSize)
	if errors.Is(err, fs.ErrNotExist) {
		return FromMissingFile(path), nil
	}
	if err != nil {
		return Desired{}, err
	}
	return Parse(path, data)
}

// source keeps the table in step with the config file. A bad file leaves
// the table as it is and marks the module degraded until a good file
// arrives.
type source struct {
	*filesource.Source[*CIDR, netip.Prefix]
	resync time.Duration // --ip-masq-agent-resync-interval
	// fileResync is the resyncInterval of the file in force (0: not set);
	// period is the re-read period in force: fileResync, else resync.
	fileResync, period time.Duration
}

func newSource(p sourceParams, initDone func(statedb.WriteTxn)) *source {
	path, resync := p.Node.IPMasqAgent.ConfigPath, p.Config.IPMasqAgentResyncInterval
	s := &source{resync: resync, period: resync}
	s.Source = &filesource.Source[*CIDR, netip.Prefix]{
		Dir:    filepath.Dir(path),
		Period: s.rereadPeriod,
		Read:   func() (*filesource.Input[*CIDR], error) { return s.read(path) },
		Failure: filesource.Always(filesource.Failure{Log: "Invalid ip-masq-agent config: keeping the CIDRs in force",
			Health: "invalid ip-masq-agent config, keeping the last good CIDRs", Announce: true}),
		Messages: filesource.Messages{
			Warning:    filesource.Line{Msg: "ip-masq-agent config", Attrs: []any{"path", path}},
			Applied:    filesource.Line{Msg: "Applied ip-masq-agent config"},
			ValidAgain: filesource.Line{Msg: "ip-masq-agent config is valid again", Attrs: []any{"path", path}},
		},
		Log: p.Log, DB: p.DB, Table: p.Table, Rows: cidrRows(), InitDone: initDone, Metrics: p.Metrics,
	}
	return s
}

func (s *source) read(path string) (*filesource.Input[*CIDR], error) {
	d, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	s.fileResync = d.ResyncInterval
	return &filesource.Input[*CIDR]{Rows: pointers(d.CIDRs), Warnings: d.Warnings, Summary: d.Summary}, nil
}

// rereadPeriod is the period in force after a read: the file's
// resyncInterval while the file in force sets it, else the flag.
func (s *source) rereadPeriod() time.Duration {
	if period := cmp.Or(s.fileResync, s.resync); period != s.period {
		from := "--ip-masq-agent-resync-interval"
		if s.fileResync != 0 {
			from = "the file's resyncInterval"
		}
		s.Log.Info("ip-masq-agent config re-read period", "period", period, "from", from)
		s.period = period
	}
	return s.period
}

// Diff makes table hold exactly rows, touching only the rows that differ.
func Diff(wtxn statedb.WriteTxn, table statedb.RWTable[*CIDR], rows []CIDR) int {
	return cidrRows().Sync(wtxn, table, pointers(rows))
}

func cidrRows() tablesync.Rows[*CIDR, netip.Prefix] {
	return tablesync.Rows[*CIDR, netip.Prefix]{
		Key:   func(c *CIDR) netip.Prefix { return c.Prefix },
		Query: PrefixIndex.Query,
		Same:  func(old, want *CIDR) bool { return *old == *want },
	}
}

func pointers(rows []CIDR) []*CIDR {
	out := make([]*CIDR, len(rows))
	for i := range rows {
		out[i] = &rows[i]
	}
	return out
}
