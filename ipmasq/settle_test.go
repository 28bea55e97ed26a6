package ipmasq_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/ipmasq"
)

// cidrCells is the ip-masq-agent cell in a hive, reading path.
type cidrCells struct {
	path  string
	db    *statedb.DB
	table statedb.Table[*ipmasq.CIDR]
}

// startCIDRCells starts the cell on path, which must exist or be a
// ConfigMap-style symlink, and waits for the table to hold want.
func startCIDRCells(t *testing.T, path string, want string) *cidrCells {
	t.Helper()
	c := &cidrCells{path: path}
	h := infra.New(infra.Core, infra.NodeConfigCell, ipmasq.Cell,
		cell.Invoke(func(db *statedb.DB, table statedb.Table[*ipmasq.CIDR]) { c.db, c.table = db, table }))
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	if err := flags.Parse([]string{"--bpf-root=" + t.TempDir(), "--state-dir=" + t.TempDir(), "--enable-ip-masq-agent",
		"--enable-bpf-masquerade", "--ip-masq-agent-config-path=" + path}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	c.wait(t, want, 10*time.Second)
	return c
}

// rows is the table as "prefix/source ...".
func rowsOf(table statedb.Table[*ipmasq.CIDR], txn statedb.ReadTxn) string {
	var out []string
	for c := range table.All(txn) {
		out = append(out, c.Prefix.String()+"/"+string(c.Source))
	}
	return strings.Join(out, " ")
}

// wait waits, on the table's watch channel, for the table to hold want and
// returns when it did.
func (c *cidrCells) wait(t *testing.T, want string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		txn := c.db.ReadTxn()
		_, watch := c.table.AllWatch(txn)
		if got := rowsOf(c.table, txn); got == want {
			return time.Now()
		}
		select {
		case <-watch:
		case <-deadline:
			t.Fatalf("the table does not hold %q after %s: %q", want, timeout, rowsOf(c.table, c.db.ReadTxn()))
		}
	}
}

// recorder records every state of the table that a change iterator shows,
// and every row changed.
type recorder struct {
	mu      sync.Mutex
	states  []string
	changed []string // "+row" or "-row"
}

func (c *cidrCells) record(t *testing.T) *recorder {
	t.Helper()
	wtxn := c.db.WriteTxn(c.table)
	changes, err := c.table.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for first := true; ; first = false {
			txn := c.db.ReadTxn()
			seq, watch := changes.Next(txn)
			r.mu.Lock()
			for ch := range seq {
				if first {
					continue // the rows already there
				}
				sign := "+"
				if ch.Deleted {
					sign = "-"
				}
				r.changed = append(r.changed, sign+ch.Object.Prefix.String()+"/"+string(ch.Object.Source))
			}
			if s := rowsOf(c.table, txn); len(r.states) == 0 || r.states[len(r.states)-1] != s {
				r.states = append(r.states, s)
			}
			r.mu.Unlock()
			select {
			case <-watch:
			case <-ctx.Done():
				return
			}
		}
	}()
	return r
}

func (r *recorder) get() ([]string, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.states), slices.Clone(r.changed)
}

const (
	oldFile = "nonMasqueradeCIDRs:\n- 10.0.0.0/8\n- 172.16.0.0/12\n- 192.168.0.0/16\n"
	oldRows = "10.0.0.0/8/config 169.254.0.0/16/link-local 172.16.0.0/12/config 192.168.0.0/16/config fe80::/10/link-local"
	// newHeader, then the items one by one: each prefix of the file is a
	// valid file with fewer CIDRs.
	newHeader = "masqLinkLocal: true\nmasqLinkLocalIPv6: true\nnonMasqueradeCIDRs:\n"
)

var newItems = []string{"10.1.0.0/16", "10.2.0.0/16", "10.3.0.0/16", "10.4.0.0/16", "10.5.0.0/16", "10.6.0.0/16"}

func newRows() string {
	var out []string
	for _, p := range newItems {
		out = append(out, p+"/config")
	}
	return strings.Join(out, " ")
}

// TestInPlaceRewriteAppliesOnlyTheFinalFile: the file truncated in place
// and written in chunks, with pauses shorter than the settle time (the
// file kept open for some chunks, opened and closed for each of the
// others), is applied once: the table holds the old rows, then the final
// ones, and nothing in between (not the defaults of an empty file, not a
// part of the list), within the settle time plus a small bound of the
// last write.
func TestInPlaceRewriteAppliesOnlyTheFinalFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config", "ip-masq-agent")
	celltest.WriteFileAtomic(t, path, oldFile)
	c := startCIDRCells(t, path, oldRows)
	r := c.record(t)

	pause := ipmasq.SettleTime / 5
	start := time.Now()
	celltest.RewriteInPlace(t, path, newHeader, newItems, pause)
	last := time.Now()

	bound := 500 * time.Millisecond
	applied := c.wait(t, newRows(), ipmasq.SettleTime+bound)
	took := applied.Sub(last)
	t.Logf("written in place over %s: applied %s after the last write (settle time %s)", last.Sub(start).Round(time.Millisecond), took, ipmasq.SettleTime)
	if took < ipmasq.SettleTime-50*time.Millisecond {
		t.Errorf("applied %s after the last write, before the settle time %s", took, ipmasq.SettleTime)
	}
	time.Sleep(ipmasq.SettleTime) // nothing more comes
	states, changed := r.get()
	if !slices.Equal(states, []string{oldRows, newRows()}) {
		t.Errorf("the table went through\n%s\nwant only\n%s\n%s", strings.Join(states, "\n"), oldRows, newRows())
	}
	// Every row changed is one that leaves or one that comes, once: a state
	// in between, even one the iterator coalesced, would change others.
	var want []string
	for _, row := range strings.Fields(oldRows) {
		want = append(want, "-"+row)
	}
	for _, row := range strings.Fields(newRows()) {
		want = append(want, "+"+row)
	}
	slices.Sort(want)
	slices.Sort(changed)
	if !slices.Equal(changed, want) {
		t.Errorf("rows changed %v, want %v", changed, want)
	}
}

// TestRenameAndConfigMapSwapAreImmediate: a temporary file renamed over the
// file, and a ConfigMap's ..data symlink swap, are applied without waiting
// for the settle time.
func TestRenameAndConfigMapSwapAreImmediate(t *testing.T) {
	newFile := newHeader
	for _, p := range newItems {
		newFile += "- " + p + "\n"
	}
	t.Run("rename", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "config", "ip-masq-agent")
		celltest.WriteFileAtomic(t, path, oldFile)
		c := startCIDRCells(t, path, oldRows)
		start := time.Now()
		celltest.WriteFileAtomic(t, path, newFile)
		took := c.wait(t, newRows(), 10*time.Second).Sub(start)
		t.Logf("a rename applied in %s", took)
		if took >= ipmasq.SettleTime {
			t.Errorf("a rename applied in %s: waited for the settle time %s", took, ipmasq.SettleTime)
		}
	})
	t.Run("configmap", func(t *testing.T) {
		// The kubelet's layout: ip-masq-agent -> ..data/ip-masq-agent,
		// ..data -> ..<timestamp>; an update writes a new timestamped
		// directory and renames a new ..data symlink over the old one.
		dir := filepath.Join(t.TempDir(), "config")
		for _, d := range [][2]string{{"..2026_01", oldFile}, {"..2026_02", newFile}} {
			if err := os.MkdirAll(filepath.Join(dir, d[0]), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, d[0], "ip-masq-agent"), []byte(d[1]), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, l := range [][2]string{{"..2026_01", "..data"}, {"..data/ip-masq-agent", "ip-masq-agent"}} {
			if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
				t.Fatal(err)
			}
		}
		c := startCIDRCells(t, filepath.Join(dir, "ip-masq-agent"), oldRows)
		start := time.Now()
		if err := os.Symlink("..2026_02", filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		took := c.wait(t, newRows(), 10*time.Second).Sub(start)
		t.Logf("a ..data swap applied in %s", took)
		if took >= ipmasq.SettleTime {
			t.Errorf("a ..data swap applied in %s: waited for the settle time %s", took, ipmasq.SettleTime)
		}
		if err := os.RemoveAll(filepath.Join(dir, "..2026_01")); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRenameIsImmediateWhileAnotherFileIsWritten: the file renamed over
// while another file of its directory is being written in place (an
// editor's swap file, a temporary file of another tool) is applied at
// once: the settle time holds back only the file written in place, and
// only the ip-masq-agent file's own writes hold it.
func TestRenameIsImmediateWhileAnotherFileIsWritten(t *testing.T) {
	newFile := newHeader
	for _, p := range newItems {
		newFile += "- " + p + "\n"
	}
	path := filepath.Join(t.TempDir(), "config", "ip-masq-agent")
	celltest.WriteFileAtomic(t, path, oldFile)
	c := startCIDRCells(t, path, oldRows)
	swap := filepath.Join(filepath.Dir(path), ".ip-masq-agent.swp")
	if err := os.WriteFile(swap, []byte("swap"), 0o644); err != nil { // settling
		t.Fatal(err)
	}
	start := time.Now()
	celltest.WriteFileAtomic(t, path, newFile)
	took := c.wait(t, newRows(), 10*time.Second).Sub(start)
	t.Logf("a rename applied in %s while another file settles", took)
	if took >= ipmasq.SettleTime/2 {
		t.Errorf("a rename applied in %s: held behind another file's settle time %s", took, ipmasq.SettleTime)
	}
}
