package ciliumnode

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/tablesync"
)

// TableName is the name of the enis table.
const TableName = "enis"

// RouteTableOffset: the ENI with number N has route table 10+N, as in
// Cilium's ENI mode (linux_defaults.RouteTableInterfacesOffset).
const RouteTableOffset = 10

// ENI is one ENI of the node, from the CiliumNode's status.eni.enis, with
// the pool IPs (spec.ipam.pool) that belong to it.
type ENI struct {
	ID             string
	Number         int
	MAC            string // lower case, colon separated
	PrimaryIP      netip.Addr
	Subnet         netip.Prefix
	Gateway        netip.Addr // the first address of the subnet
	VPCPrimaryCIDR netip.Prefix
	VPCCIDRs       []netip.Prefix
	// Pool are the spec.ipam.pool IPs whose resource is this ENI, sorted.
	Pool []netip.Addr
	// Addresses are the ENI's secondary IPs (status.eni.enis[].addresses),
	// sorted; Prefixes its delegated prefixes (prefixes, ipv6-prefixes).
	// With them and the primary IP, they are the IPs the ENI holds, as
	// Cilium's ENI IPAM places an IP (Holds).
	Addresses []netip.Addr   `json:",omitempty"`
	Prefixes  []netip.Prefix `json:",omitempty"`
	// Skipped says why the ENI hands out no IPs ("" when it does):
	// its number is below first-interface-index.
	Skipped string `json:",omitempty"`
	// Refused are the spec.ipam.pool IPs of this ENI that are not handed
	// out, each with why (the unspecified address, the gateway, ...).
	Refused []RefusedIP `json:",omitempty"`
}

// RefusedIP is a pool IP that cannot be a pod IP, and why.
type RefusedIP struct {
	IP     netip.Addr
	Reason string
}

func (r RefusedIP) String() string { return r.IP.String() + " (" + r.Reason + ")" }

// RouteTable is the ENI's route table: 10 + number.
func (e *ENI) RouteTable() int { return RouteTableOffset + e.Number }

// Usable says whether the ENI's pool IPs are handed out.
func (e *ENI) Usable() bool { return e.Skipped == "" }

// VPCCIDRsAll is the VPC primary CIDR followed by the other VPC CIDRs.
func (e *ENI) VPCCIDRsAll() []netip.Prefix {
	out := make([]netip.Prefix, 0, 1+len(e.VPCCIDRs))
	if e.VPCPrimaryCIDR.IsValid() {
		out = append(out, e.VPCPrimaryCIDR)
	}
	return append(out, e.VPCCIDRs...)
}

// Equal compares every field.
func (e *ENI) Equal(o *ENI) bool {
	return e.ID == o.ID && e.Number == o.Number && e.MAC == o.MAC && e.PrimaryIP == o.PrimaryIP &&
		e.Subnet == o.Subnet && e.Gateway == o.Gateway && e.VPCPrimaryCIDR == o.VPCPrimaryCIDR &&
		slices.Equal(e.VPCCIDRs, o.VPCCIDRs) && slices.Equal(e.Pool, o.Pool) &&
		slices.Equal(e.Addresses, o.Addresses) && slices.Equal(e.Prefixes, o.Prefixes) &&
		e.Skipped == o.Skipped && slices.Equal(e.Refused, o.Refused)
}

// Holds says whether the ENI holds ip: its primary IP, one of its
// addresses or inside one of its delegated prefixes (Cilium's
// eniContainsIP, pkg/ipam/eni.go, which picks the ENI of an allocation
// result and so the route table of the IP's egress rules).
func (e *ENI) Holds(ip netip.Addr) bool {
	if ip == e.PrimaryIP {
		return true
	}
	if _, found := slices.BinarySearchFunc(e.Addresses, ip, netip.Addr.Compare); found {
		return true
	}
	return slices.ContainsFunc(e.Prefixes, func(p netip.Prefix) bool { return p.Contains(ip) })
}

func (e *ENI) TableHeader() []string {
	return []string{"ID", "Number", "Table", "MAC", "Subnet", "Gateway", "VPC", "Pool", "State"}
}

func (e *ENI) TableRow() []string {
	state := "Usable"
	if !e.Usable() {
		state = "Skipped: " + e.Skipped
	}
	if len(e.Refused) > 0 {
		refused := make([]string, len(e.Refused))
		for i, r := range e.Refused {
			refused[i] = r.String()
		}
		state += "; refused " + strings.Join(refused, ", ")
	}
	return []string{
		e.ID, strconv.Itoa(e.Number), strconv.Itoa(e.RouteTable()), e.MAC, e.Subnet.String(), e.Gateway.String(),
		joinPrefixes(e.VPCCIDRsAll()), strconv.Itoa(len(e.Pool)), state,
	}
}

func joinPrefixes(ps []netip.Prefix) string {
	if len(ps) == 0 {
		return "-"
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// ENIIDIndex is the primary index of enis.
var ENIIDIndex = tablesync.StringIndex("id", func(e *ENI) string { return e.ID })

// NewTable creates and registers the enis table.
func NewTable(db *statedb.DB) (statedb.RWTable[*ENI], error) {
	return statedb.NewTable(db, TableName, ENIIDIndex)
}
