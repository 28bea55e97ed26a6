package ipmasq

import (
	"bytes"
	"cmp"
	"errors"
	"io/fs"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/prefixorder"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// SettleTime is how long the file, written in place, must go without a
// write before it is read: a writer that truncates it and writes it in
// chunks (a shell redirection, a pipeline, a copy over the network) is
// applied once, when done, never in its half-written states (an empty file
// for a moment, half a list). A second is longer than the pauses of a
// writer that is still working, and short next to how often the file
// changes and to the periodic re-read. A rename over the file and a
// ConfigMap's ..data swap are applied at once.
const SettleTime = time.Second

// source keeps the table in step with the config file. A bad file leaves
// the table as it is and marks the module degraded until a good file
// arrives.
type source struct {
	*filesource.Source[*CIDR, netip.Prefix]
	resync time.Duration // --ip-masq-agent-resync-interval
	// fileResync is the resyncInterval of the file in force (0: not set);
	// period is the re-read period in force: fileResync, else resync.
	fileResync, period time.Duration

	// last is the last file read and what it gave: the same bytes again (a
	// re-read, the events of a burst after the one read) are not parsed
	// again, and the same Input is returned (filesource does not diff it).
	last parsedFile
}

// parsedFile is a file's bytes and what they parse to.
type parsedFile struct {
	data   []byte
	in     *filesource.Input[*CIDR]
	resync time.Duration // the file's resyncInterval
	err    error
}

func newSource(p sourceParams, initDone func(statedb.WriteTxn)) *source {
	path, resync := p.Node.IPMasqAgent.ConfigPath, p.Config.IPMasqAgentResyncInterval
	s := &source{resync: resync, period: resync}
	s.Source = &filesource.Source[*CIDR, netip.Prefix]{
		Dir:    filepath.Dir(path),
		Period: s.rereadPeriod,
		Settle: SettleTime,
		File:   filepath.Base(path),
		Read:   func() (*filesource.Input[*CIDR], error) { return s.read(path) },
		Failure: filesource.Always(filesource.Failure{Log: "Invalid ip-masq-agent config: keeping the CIDRs in force",
			Health: "invalid ip-masq-agent config, keeping the last good CIDRs", Announce: true}),
		Messages: filesource.Messages{
			Warning:    filesource.Line{Msg: "ip-masq-agent config", Attrs: []any{"path", path}},
			Applied:    filesource.Line{Msg: "Applied ip-masq-agent config"},
			ValidAgain: filesource.Line{Msg: "ip-masq-agent config is valid again", Attrs: []any{"path", path}},
		},
		Log: p.Log, DB: p.DB, Table: p.Table, Rows: cidrRows(), InitDone: initDone, Metrics: p.Metrics,
		// Desired.CIDRs are sorted and distinct.
		Order: func(a, b *CIDR) int { return prefixorder.Compare(a.Prefix, b.Prefix) },
	}
	return s
}

// read reads and parses the file; a missing file (or a dangling ConfigMap
// symlink, or a missing directory) gives the defaults.
func (s *source) read(path string) (*filesource.Input[*CIDR], error) {
	data, err := filewatch.ReadRegular(path, MaxFileSize)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.last = parsedFile{in: input(FromMissingFile(path))}
	case err != nil:
		s.last = parsedFile{}
		return nil, err
	case s.last.data == nil || !bytes.Equal(data, s.last.data):
		d, err := Parse(path, data)
		s.last = parsedFile{data: data, err: err}
		if err == nil {
			s.last.in, s.last.resync = input(d), d.ResyncInterval
		}
	}
	if s.last.err == nil {
		s.fileResync = s.last.resync
	}
	return s.last.in, s.last.err
}

func input(d Desired) *filesource.Input[*CIDR] {
	return &filesource.Input[*CIDR]{Rows: pointers(d.CIDRs), Warnings: d.Warnings, Summary: d.Summary}
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
