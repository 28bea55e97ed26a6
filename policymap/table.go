package policymap

import (
	"net/netip"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
)

// MasqTableName is the table of cilium_ipmasq_v4/_v6 entries.
const MasqTableName = "masq-map-entries"

// MasqEntry is one entry of cilium_ipmasq_v4 or cilium_ipmasq_v6, or a
// non-masquerade CIDR that is not programmed (Skipped says why).
type MasqEntry struct {
	Prefix  netip.Prefix
	Map     string // "" when skipped
	Skipped string `json:",omitempty"`
	Status  reconciler.Status

	key []byte // the kernel key, encoded once
}

var masqValue = bpf.IPMasqValue()

func (e *MasqEntry) MapName() string  { return e.Map }
func (e *MasqEntry) MapKey() []byte   { return e.key }
func (e *MasqEntry) MapValue() []byte { return masqValue }

func (e *MasqEntry) Clone() *MasqEntry { c := *e; return &c }

func (e *MasqEntry) GetStatus() reconciler.Status { return e.Status }

func (e *MasqEntry) SetStatus(s reconciler.Status) *MasqEntry {
	e.Status = s
	return e
}

func (e *MasqEntry) TableHeader() []string {
	return []string{"Prefix", "Map", "Status", "Reason"}
}

func (e *MasqEntry) TableRow() []string {
	if e.Map == "" {
		return []string{e.Prefix.String(), "-", "Skipped", e.Skipped}
	}
	return []string{e.Prefix.String(), e.Map, e.Status.Kind.String(), e.Status.GetError()}
}

// MasqPrefixIndex is the primary index.
var MasqPrefixIndex = statedb.Index[*MasqEntry, netip.Prefix]{
	Name: "prefix",
	FromObject: func(e *MasqEntry) index.KeySet {
		return index.NewKeySet(index.NetIPPrefix(e.Prefix))
	},
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// NewMasqTable creates and registers masq-map-entries.
func NewMasqTable(db *statedb.DB) (statedb.RWTable[*MasqEntry], error) {
	return statedb.NewTable(db, MasqTableName, MasqPrefixIndex)
}
