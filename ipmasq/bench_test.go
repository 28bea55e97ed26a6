package ipmasq

import (
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/celltest"

	"github.com/cilium/statedb"
)

// benchFile is a config with n IPv4 /32s (link-local v4 and v6 added).
func benchFile(n int, extra ...string) []byte { return []byte(celltest.IPMasqAgentConfig(n, extra...)) }

func newBenchTable(b *testing.B) (*statedb.DB, statedb.RWTable[*CIDR]) {
	db := statedb.New()
	tbl, err := NewTable(db)
	if err != nil {
		b.Fatal(err)
	}
	return db, tbl
}

// BenchmarkParseApply16384 parses a file that fills the v4 map (16383 CIDRs
// plus 169.254.0.0/16) and applies it to an empty table. The floor is the raw
// statedb work for the same rows: insert them all in one transaction.
func BenchmarkParseApply16384(b *testing.B) {
	data := benchFile(MaxCIDRsPerFamily - 1)
	d, err := Parse("bench", data)
	if err != nil {
		b.Fatal(err)
	}

	var floor time.Duration
	for range 5 {
		db, tbl := newBenchTable(b)
		start := time.Now()
		wtxn := db.WriteTxn(tbl)
		for i := range d.CIDRs {
			tbl.Insert(wtxn, &d.CIDRs[i])
		}
		wtxn.Commit()
		if el := time.Since(start); floor == 0 || el < floor {
			floor = el
		}
	}

	b.ResetTimer()
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		db, tbl := newBenchTable(b)
		b.StartTimer()
		start := time.Now()
		d, err := Parse("bench", data)
		if err != nil {
			b.Fatal(err)
		}
		wtxn := db.WriteTxn(tbl)
		if n := Diff(wtxn, tbl, d.CIDRs); n != len(d.CIDRs) {
			b.Fatalf("%d rows changed, want %d", n, len(d.CIDRs))
		}
		wtxn.Commit()
		total += time.Since(start)
	}
	b.ReportMetric(float64(floor.Microseconds()), "floor-us")
	b.ReportMetric(float64(total)/float64(b.N)/float64(floor), "x-floor")
}

// BenchmarkOneCIDREdit applies a file that adds one CIDR to a table of 16383
// and checks, by revisions, that exactly one row was written.
func BenchmarkOneCIDREdit(b *testing.B) {
	base := benchFile(MaxCIDRsPerFamily - 2)
	edited := benchFile(MaxCIDRsPerFamily-2, "100.200.0.0/16")
	db, tbl := newBenchTable(b)
	dBase, err := Parse("bench", base)
	if err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		wtxn := db.WriteTxn(tbl)
		Diff(wtxn, tbl, dBase.CIDRs)
		wtxn.Commit()
		before := tbl.Revision(db.ReadTxn())
		b.StartTimer()

		d, err := Parse("bench", edited)
		if err != nil {
			b.Fatal(err)
		}
		wtxn = db.WriteTxn(tbl)
		Diff(wtxn, tbl, d.CIDRs)
		wtxn.Commit()

		b.StopTimer()
		rtxn := db.ReadTxn()
		changed := 0
		for _, rev := range tbl.All(rtxn) {
			if rev > before {
				changed++
			}
		}
		if changed != 1 {
			b.Fatalf("%d rows have a new revision, want 1", changed)
		}
		b.ReportMetric(float64(changed), "rows-changed")
		b.StartTimer()
	}
}
