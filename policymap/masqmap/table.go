package masqmap

import (
	"net/netip"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
)

// TableName is the table of cilium_ipmasq_v4/_v6 entries.
const TableName = "masq-map-entries"

// Entry is one entry of cilium_ipmasq_v4 or cilium_ipmasq_v6, or a
// non-masquerade CIDR that is not programmed (Skipped says why).
type Entry struct {
	Prefix  netip.Prefix
	Map     string // "" when skipped
	Skipped string `json:",omitempty"`
	Status  reconciler.Status

	key []byte // the kernel key, encoded once
}

var masqValue = bpf.IPMasqValue()

func (e *Entry) MapName() string  { return e.Map }
func (e *Entry) MapKey() []byte   { return e.key }
func (e *Entry) MapValue() []byte { return masqValue }

func (e *Entry) Clone() *Entry { c := *e; return &c }

func (e *Entry) GetStatus() reconciler.Status { return e.Status }

func (e *Entry) SetStatus(s reconciler.Status) *Entry {
	e.Status = s
	return e
}

func (e *Entry) TableHeader() []string {
	return []string{"Prefix", "Map", "Status", "Reason"}
}

func (e *Entry) TableRow() []string {
	if e.Map == "" {
		return []string{e.Prefix.String(), "-", "Skipped", e.Skipped}
	}
	return []string{e.Prefix.String(), e.Map, e.Status.Kind.String(), e.Status.GetError()}
}

// PrefixIndex is the primary index.
var PrefixIndex = statedb.Index[*Entry, netip.Prefix]{
	Name: "prefix",
	FromObject: func(e *Entry) index.KeySet {
		return index.NewKeySet(index.NetIPPrefix(e.Prefix))
	},
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// NewTable creates and registers masq-map-entries.
func NewTable(db *statedb.DB) (statedb.RWTable[*Entry], error) {
	return statedb.NewTable(db, TableName, PrefixIndex)
}
