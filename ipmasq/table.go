package ipmasq

import (
	"iter"
	"net/netip"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// TableName is the name of the table of non-masquerade CIDRs in effect.
const TableName = "ip-masq-agent-cidrs"

// Source says why a CIDR is in effect.
type Source string

const (
	SourceConfig    Source = "config"     // listed in nonMasqueradeCIDRs
	SourceDefault   Source = "default"    // a reserved range, the file being missing
	SourceLinkLocal Source = "link-local" // link-local, masqLinkLocal(IPv6) being false
)

// CIDR is a non-masquerade CIDR in effect: traffic to it is not masqueraded.
type CIDR struct {
	Prefix netip.Prefix
	Source Source
}

// Family is "ipv4" or "ipv6".
func (c *CIDR) Family() string {
	if c.Prefix.Addr().Is4() {
		return "ipv4"
	}
	return "ipv6"
}

func (c *CIDR) TableHeader() []string {
	return []string{"Prefix", "Family", "Source"}
}

func (c *CIDR) TableRow() []string {
	return []string{c.Prefix.String(), c.Family(), string(c.Source)}
}

var (
	// PrefixIndex is the primary index: one row per prefix.
	PrefixIndex = statedb.Index[*CIDR, netip.Prefix]{
		Name: "prefix",
		FromObject: func(c *CIDR) index.KeySet {
			return index.NewKeySet(index.NetIPPrefix(c.Prefix))
		},
		FromKey:    index.NetIPPrefix,
		FromString: index.NetIPPrefixString,
		Unique:     true,
	}

	// LPMIndex answers "is this address exempt from masquerading" with a
	// longest-prefix match: CIDRs.First(txn, LPMIndex.Query(addr)).
	LPMIndex = statedb.NetIPPrefixIndex[*CIDR]{
		Name: "lpm",
		FromObject: func(c *CIDR) iter.Seq[netip.Prefix] {
			return statedb.Just(c.Prefix)
		},
		Unique: true,
	}
)

// NewTable creates and registers the ip-masq-agent-cidrs table.
func NewTable(db *statedb.DB) (statedb.RWTable[*CIDR], error) {
	return statedb.NewTable(db, TableName, PrefixIndex, LPMIndex)
}
