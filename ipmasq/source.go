package ipmasq

import (
	"cmp"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/metrics"
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

// source keeps the table in step with the config file.
type source struct {
	path     string
	resync   time.Duration
	log      *slog.Logger
	db       *statedb.DB
	table    statedb.RWTable[*CIDR]
	initDone func(statedb.WriteTxn) // nil once the table is initialized
	metrics  *metrics.Source

	// period is the re-read period in force: the file's resyncInterval
	// while the file in force sets it, else resync (the flag).
	period time.Duration

	lastErr      string // logged once per distinct error
	lastWarnings string // logged once per distinct set
	lastSummary  string
}

// run watches the config directory (or, while it is missing, its nearest
// existing ancestor) and re-reads the file on events and every resync.
func (s *source) run(ctx context.Context, health cell.Health) error {
	s.period = s.resync
	return filewatch.WatchDirPeriod(ctx, s.log, filepath.Dir(s.path), func() time.Duration { return s.period },
		func() { s.reload(health) })
}

// reload reads the file and applies it. A bad file leaves the table as it is
// and marks the module degraded until a good file arrives.
func (s *source) reload(health cell.Health) {
	d, err := ReadFile(s.path)
	if err != nil {
		s.metrics.Error()
		if msg := err.Error(); msg != s.lastErr {
			s.lastErr = msg
			s.log.Error("Invalid ip-masq-agent config: keeping the CIDRs in force", "error", err)
		}
		health.Degraded("invalid ip-masq-agent config, keeping the last good CIDRs", err)
		return
	}
	if s.lastErr != "" {
		s.log.Info("ip-masq-agent config is valid again", "path", s.path)
		s.lastErr = ""
	}
	if w := strings.Join(d.Warnings, "\n"); w != s.lastWarnings {
		s.lastWarnings = w
		for _, warning := range d.Warnings {
			s.log.Warn("ip-masq-agent config", "path", s.path, "warning", warning)
		}
	}
	changed := s.apply(d)
	s.metrics.Success()
	if period := cmp.Or(d.ResyncInterval, s.resync); period != s.period {
		from := "--ip-masq-agent-resync-interval"
		if d.ResyncInterval != 0 {
			from = "the file's resyncInterval"
		}
		s.log.Info("ip-masq-agent config re-read period", "period", period, "from", from)
		s.period = period
	}
	if changed > 0 || d.Summary != s.lastSummary {
		s.log.Info("Applied ip-masq-agent config", "summary", d.Summary, "rows-changed", changed)
		s.lastSummary = d.Summary
	}
	health.OK(d.Summary)
}

// apply writes the difference between the table and d: unchanged rows are
// not rewritten, so their revision stays and consumers do no work for them.
// It returns the number of rows inserted, changed or deleted.
func (s *source) apply(d Desired) int {
	wtxn := s.db.WriteTxn(s.table)
	changed := Diff(wtxn, s.table, d.CIDRs)
	if s.initDone != nil {
		s.initDone(wtxn)
		s.initDone = nil
	}
	wtxn.Commit()
	return changed
}

// Diff makes table hold exactly rows, touching only the rows that differ.
func Diff(wtxn statedb.WriteTxn, table statedb.RWTable[*CIDR], rows []CIDR) int {
	desired := make([]*CIDR, len(rows))
	for i := range rows {
		desired[i] = &rows[i]
	}
	return tablesync.Rows[*CIDR, netip.Prefix]{
		Key:   func(c *CIDR) netip.Prefix { return c.Prefix },
		Query: PrefixIndex.Query,
		Same:  func(old, want *CIDR) bool { return *old == *want },
	}.Sync(wtxn, table, desired)
}
