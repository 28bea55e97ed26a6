package celltest

import (
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// Row is the row of a table in the tests of the table plumbing (tablesync,
// filesource): a name and a value.
type Row struct{ Name, Value string }

func (r *Row) TableHeader() []string { return []string{"Name", "Value"} }
func (r *Row) TableRow() []string    { return []string{r.Name, r.Value} }

// RowNameIndex is the primary index of a table of Rows.
var RowNameIndex = statedb.Index[*Row, string]{
	Name:       "name",
	FromObject: func(r *Row) index.KeySet { return index.NewKeySet(index.String(r.Name)) },
	FromKey:    index.String,
	Unique:     true,
}
