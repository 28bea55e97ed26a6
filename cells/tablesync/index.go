package tablesync

import (
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// StringIndex is a unique index of a table by a string key of its rows
// (a name, an ID), queryable by that string in db/get.
func StringIndex[Obj any](name string, key func(Obj) string) statedb.Index[Obj, string] {
	return statedb.Index[Obj, string]{
		Name: name,
		FromObject: func(o Obj) index.KeySet {
			return index.NewKeySet(index.String(key(o)))
		},
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
}
