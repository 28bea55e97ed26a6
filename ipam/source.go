package ipam

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/metrics"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// ReadCiliumNodeFile reads and parses the CiliumNode file. A missing file
// gives an error wrapping fs.ErrNotExist.
func ReadCiliumNodeFile(path string) (*CiliumNode, error) {
	data, err := filewatch.ReadRegular(path, MaxCiliumNodeSize)
	if err != nil {
		return nil, err
	}
	return ParseCiliumNode(path, data)
}

// source keeps the enis table in step with the CiliumNode file.
//
// Unlike the ip-masq-agent file, a missing CiliumNode has no defaults: until
// the file is first read the table stays uninitialized (nothing is pruned,
// allocation answers "not ready"), and once read, a file that disappears or
// goes bad leaves the last ENIs in force.
type source struct {
	path     string
	resync   time.Duration
	log      *slog.Logger
	db       *statedb.DB
	table    statedb.RWTable[*ENI]
	initDone func(statedb.WriteTxn) // nil once the table is initialized
	metrics  *metrics.Source

	lastErr      string
	lastWarnings string
	lastSummary  string
}

// run re-reads the CiliumNode file whenever its directory changes (or, while
// the directory is missing, its nearest existing ancestor) and every resync.
func (s *source) run(ctx context.Context, health cell.Health) error {
	return filewatch.WatchDir(ctx, s.log, filepath.Dir(s.path), s.resync, func() { s.reload(health) })
}

func (s *source) reload(health cell.Health) {
	n, err := ReadCiliumNodeFile(s.path)
	if err != nil {
		s.fail(health, err)
		return
	}
	if s.lastErr != "" && s.initDone == nil {
		s.log.Info("CiliumNode file is valid again", "path", s.path)
	}
	s.lastErr = ""
	s.apply(health, n)
}

// apply writes the ENIs of n into the table (initializing it the first
// time) and reports health OK. The file and the API sources share it: the
// same CiliumNode gives the same rows.
func (s *source) apply(health cell.Health, n *CiliumNode) {
	if w := strings.Join(n.Warnings, "\n"); w != s.lastWarnings {
		s.lastWarnings = w
		for _, warning := range n.Warnings {
			s.log.Warn("CiliumNode", "path", s.path, "warning", warning)
		}
	}
	s.metrics.Success()
	wtxn := s.db.WriteTxn(s.table)
	changed := DiffENIs(wtxn, s.table, n.ENIs)
	if s.initDone != nil {
		s.initDone(wtxn)
		s.initDone = nil
	}
	wtxn.Commit()
	summary := n.Summary()
	if changed > 0 || summary != s.lastSummary {
		s.log.Info("Applied CiliumNode", "path", s.path, "summary", summary, "rows-changed", changed)
		s.lastSummary = summary
	}
	health.OK(summary)
}

func (s *source) fail(health cell.Health, err error) {
	if !errors.Is(err, fs.ErrNotExist) || s.initDone == nil {
		s.metrics.Error()
	}
	if msg := err.Error(); msg != s.lastErr {
		s.lastErr = msg
		switch {
		case errors.Is(err, fs.ErrNotExist) && s.initDone != nil:
			s.log.Info("CiliumNode file does not exist yet: no ENIs, no allocations until it does", "path", s.path)
		case errors.Is(err, fs.ErrNotExist):
			s.log.Error("CiliumNode file disappeared: keeping the last ENIs", "path", s.path)
		case s.initDone != nil:
			s.log.Error("Invalid CiliumNode: no ENIs until it is fixed", "error", err)
		default:
			s.log.Error("Invalid CiliumNode: keeping the last ENIs", "error", err)
		}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist) && s.initDone != nil:
		// Not an error of the agent: the node may not have ENIs yet, or the
		// agent runs without ENI IPAM in use.
		health.OK(fmt.Sprintf("waiting for the CiliumNode file %s", s.path))
	case errors.Is(err, fs.ErrNotExist):
		health.Degraded("CiliumNode file disappeared, keeping the last ENIs", err)
	case s.initDone != nil:
		health.Degraded("invalid CiliumNode, no ENIs yet", err)
	default:
		health.Degraded("invalid CiliumNode, keeping the last ENIs", err)
	}
}

// DiffENIs makes table hold exactly enis, touching only the rows that
// differ. It returns the number of rows inserted, changed or deleted.
func DiffENIs(wtxn statedb.WriteTxn, table statedb.RWTable[*ENI], enis []*ENI) int {
	return tablesync.Rows[*ENI, string]{
		Key:   func(e *ENI) string { return e.ID },
		Query: ENIIDIndex.Query,
		Same:  (*ENI).Equal,
	}.Sync(wtxn, table, enis)
}
