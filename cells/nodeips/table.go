package nodeips

import (
	"net/netip"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// TableName is the table of this node's IP addresses.
const TableName = "node-ips"

// The sources of rows; each writes and prunes only its own.
const (
	SourceNetlink = "netlink" // an address of an interface in the agent's network namespace
	SourceENI     = "eni"     // an ENI's primary IP (ipam)
)

// NodeIP is one address of this node, as one source reports it.
type NodeIP struct {
	Addr   netip.Addr
	Source string
	Device string // the interface, or the ENI ID
}

// Key is the primary key: an address may come from several sources.
type Key struct {
	Addr   netip.Addr
	Source string
}

func (n *NodeIP) Key() Key { return Key{n.Addr, n.Source} }

func (n *NodeIP) TableHeader() []string { return []string{"Address", "Source", "Device"} }
func (n *NodeIP) TableRow() []string    { return []string{n.Addr.String(), n.Source, n.Device} }

var (
	// KeyIndex is the primary index: address and source.
	KeyIndex = statedb.Index[*NodeIP, Key]{
		Name: "key",
		FromObject: func(n *NodeIP) index.KeySet {
			return index.NewKeySet(keyOf(n.Key()))
		},
		FromKey: keyOf,
		FromString: func(s string) (index.Key, error) {
			// "address source", as db/show prints the row.
			a, src, _ := strings.Cut(s, " ")
			addr, err := netip.ParseAddr(a)
			if err != nil {
				return nil, err
			}
			return keyOf(Key{addr, src}), nil
		},
		Unique: true,
	}
	// SourceIndex lists the rows of one source.
	SourceIndex = statedb.Index[*NodeIP, string]{
		Name: "source",
		FromObject: func(n *NodeIP) index.KeySet {
			return index.NewKeySet(index.String(n.Source))
		},
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     false,
	}
)

func keyOf(k Key) index.Key {
	return append(index.NetIPAddr(k.Addr), index.String(k.Source)...)
}

// NewTable creates and registers node-ips.
func NewTable(db *statedb.DB) (statedb.RWTable[*NodeIP], error) {
	return statedb.NewTable(db, TableName, KeyIndex, SourceIndex)
}

// Set is the addresses of this node, each once, from every source.
func Set(txn statedb.ReadTxn, table statedb.Table[*NodeIP]) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for n := range table.All(txn) {
		out[n.Addr] = true
	}
	return out
}
