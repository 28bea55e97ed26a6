package ipam

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

// Table names.
const (
	ENITableName        = "enis"
	AllocationTableName = "ipam-allocations"
	RuleTableName       = "eni-rules"
	RouteTableName      = "eni-routes"
)

// Rule priorities and route tables, as in Cilium's ENI mode
// (linux_defaults.RulePriorityIngress, RulePriorityEgressv2,
// RouteTableInterfacesOffset).
const (
	// RulePriorityIngress: "to <pod> lookup main", so that traffic to the
	// pod is routed by the main table whatever its source.
	RulePriorityIngress = 20
	// RulePriorityEgress: "from <pod> [to <cidr>] lookup <10+number>".
	RulePriorityEgress = 111
	// RouteTableOffset: the ENI with number N has route table 10+N.
	RouteTableOffset = 10
	// MainTable is the main routing table.
	MainTable = 254
)

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
var ENIIDIndex = statedb.Index[*ENI, string]{
	Name: "id",
	FromObject: func(e *ENI) index.KeySet {
		return index.NewKeySet(index.String(e.ID))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NewENITable creates and registers the enis table.
func NewENITable(db *statedb.DB) (statedb.RWTable[*ENI], error) {
	return statedb.NewTable(db, ENITableName, ENIIDIndex)
}

// AllocationState says where an allocation stands.
type AllocationState string

const (
	// StateAllocated: the IP is in the pool of a usable ENI; its rules are
	// desired.
	StateAllocated AllocationState = "Allocated"
	// StateRestored: read from the checkpoint, the CiliumNode not read yet.
	StateRestored AllocationState = "Restored"
	// StateOrphaned: the IP has left the pool; its rules are removed. The
	// allocation stays until it is released (or its IP returns).
	StateOrphaned AllocationState = "Orphaned"
)

// Allocation is a pod IP handed out to an owner (namespace/pod), held by
// one attachment: the CNI's container ID and interface name. Two sandboxes
// of one pod (a StatefulSet pod recreated before the old sandbox's DEL) are
// two attachments with an IP each; a DEL releases only its own. An
// allocation made through the API without a container ID (Attachment is
// zero) belongs to its owner, as before attachments existed.
type Allocation struct {
	IP    netip.Addr
	Owner string
	// PodUID is the pod's UID, when the runtime passed K8S_POD_UID.
	PodUID     string     `json:",omitempty"`
	Attachment Attachment `json:",omitzero"`
	// V1 marks an allocation restored from a version-1 checkpoint (made by
	// the CNI before attachments were recorded): the DEL of its owner's pod
	// releases it. An allocation of the API (no attachment, not V1) is
	// released only through the API.
	V1 bool `json:",omitempty"`
	// ENI is the ENI whose pool holds the IP ("" when none does).
	ENI    string
	State  AllocationState
	Reason string `json:",omitempty"`
}

// Attachment is the CNI spec's attachment key (ipamapi): the network name,
// the container ID and the interface name in the container.
type Attachment = ipamapi.Attachment

// Family is "ipv4" or "ipv6".
func (a *Allocation) Family() string { return familyOf(a.IP) }

func (a *Allocation) TableHeader() []string {
	return []string{"IP", "Owner", "Attachment", "ENI", "State", "Reason"}
}

func (a *Allocation) TableRow() []string {
	eni := a.ENI
	if eni == "" {
		eni = "-"
	}
	return []string{a.IP.String(), a.Owner, a.Attachment.String(), eni, string(a.State), a.Reason}
}

var (
	// AllocationIPIndex is the primary index of ipam-allocations.
	AllocationIPIndex = statedb.Index[*Allocation, netip.Addr]{
		Name: "ip",
		FromObject: func(a *Allocation) index.KeySet {
			return index.NewKeySet(index.NetIPAddr(a.IP))
		},
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
		Unique:     true,
	}
	// AllocationOwnerIndex finds the allocations of an owner.
	AllocationOwnerIndex = statedb.Index[*Allocation, string]{
		Name: "owner",
		FromObject: func(a *Allocation) index.KeySet {
			return index.NewKeySet(index.String(a.Owner))
		},
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     false,
	}
	// AllocationAttachmentIndex finds the allocations of an attachment
	// (one per family). As a string query: "[network:]containerID/ifname".
	AllocationAttachmentIndex = statedb.Index[*Allocation, Attachment]{
		Name: "attachment",
		FromObject: func(a *Allocation) index.KeySet {
			return index.NewKeySet(attachmentKey(a.Attachment))
		},
		FromKey: attachmentKey,
		FromString: func(s string) (index.Key, error) {
			var att Attachment
			if network, rest, ok := strings.Cut(s, ":"); ok {
				att.Network, s = network, rest
			}
			att.ContainerID, att.IfName, _ = strings.Cut(s, "/")
			return attachmentKey(att), nil
		},
		Unique: false,
	}
)

// attachmentKey is the attachment's (network, containerID, ifname): the
// same container and interface in another network is another attachment.
func attachmentKey(a Attachment) index.Key {
	return index.String(a.Network + "\x00" + a.ContainerID + "\x00" + a.IfName)
}

// NewAllocationTable creates and registers the ipam-allocations table.
func NewAllocationTable(db *statedb.DB) (statedb.RWTable[*Allocation], error) {
	return statedb.NewTable(db, AllocationTableName, AllocationIPIndex, AllocationOwnerIndex, AllocationAttachmentIndex)
}

// RuleKey identifies an ip rule: what the kernel compares (with the
// protocol, which is always RTProto).
type RuleKey struct {
	Priority int
	From     netip.Prefix // invalid: all
	To       netip.Prefix // invalid: all
	Table    int
}

// String is the canonical form, also accepted by db/get:
// "priority,from,to,table", e.g. "111,10.130.100.133/32,10.0.0.0/8,11".
func (k RuleKey) String() string {
	return fmt.Sprintf("%d,%s,%s,%d", k.Priority, prefixOrAll(k.From), prefixOrAll(k.To), k.Table)
}

// indexKey sorts by priority, then source, destination (addresses in
// numeric order, "all" first) and table.
func (k RuleKey) indexKey() index.Key {
	key := make([]byte, 0, 4+2*18+4)
	key = binary.BigEndian.AppendUint32(key, uint32(k.Priority))
	key = appendPrefixKey(key, k.From)
	key = appendPrefixKey(key, k.To)
	return binary.BigEndian.AppendUint32(key, uint32(k.Table))
}

// appendPrefixKey appends 18 bytes: 0 for "all" (invalid) or 1, the address
// as 16 bytes, the prefix length.
func appendPrefixKey(key []byte, p netip.Prefix) []byte {
	if !p.IsValid() {
		return append(key, make([]byte, 18)...)
	}
	a := p.Addr().As16()
	key = append(key, 1)
	key = append(key, a[:]...)
	return append(key, byte(p.Bits()))
}

// ParseRuleKey parses RuleKey.String's format.
func ParseRuleKey(s string) (RuleKey, error) {
	parts := strings.Split(s, ",")
	if len(parts) != 4 {
		return RuleKey{}, fmt.Errorf("rule key %q: want priority,from,to,table", s)
	}
	var k RuleKey
	var err error
	if k.Priority, err = strconv.Atoi(parts[0]); err != nil {
		return RuleKey{}, fmt.Errorf("rule key %q: priority: %w", s, err)
	}
	if k.From, err = parsePrefixOrAll(parts[1]); err != nil {
		return RuleKey{}, fmt.Errorf("rule key %q: from: %w", s, err)
	}
	if k.To, err = parsePrefixOrAll(parts[2]); err != nil {
		return RuleKey{}, fmt.Errorf("rule key %q: to: %w", s, err)
	}
	if k.Table, err = strconv.Atoi(parts[3]); err != nil {
		return RuleKey{}, fmt.Errorf("rule key %q: table: %w", s, err)
	}
	return k, nil
}

func prefixOrAll(p netip.Prefix) string {
	if !p.IsValid() {
		return "all"
	}
	return p.String()
}

func parsePrefixOrAll(s string) (netip.Prefix, error) {
	if s == "all" {
		return netip.Prefix{}, nil
	}
	return netip.ParsePrefix(s)
}

// Rule is a desired ip rule of a pod.
type Rule struct {
	RuleKey
	// Pod is the pod IP the rule is for; Owner its owner.
	Pod    netip.Addr
	Owner  string
	Status reconciler.Status
}

// Family is the address family of the rule (unix.AF_INET or AF_INET6).
func (r *Rule) Family() int { return addrFamily(r.Pod) }

func (r *Rule) Clone() *Rule { c := *r; return &c }

func (r *Rule) GetStatus() reconciler.Status { return r.Status }

func (r *Rule) SetStatus(s reconciler.Status) *Rule {
	r.Status = s
	return r
}

// sameDesired compares everything but the status.
func (r *Rule) sameDesired(o *Rule) bool {
	return r.RuleKey == o.RuleKey && r.Pod == o.Pod && r.Owner == o.Owner
}

// IPRule prints the rule as `ip rule` does.
func (r *Rule) IPRule() string { return formatRule(r.RuleKey) }

func (r *Rule) TableHeader() []string {
	return []string{"Priority", "From", "To", "Table", "Owner", "Status", "Error"}
}

func (r *Rule) TableRow() []string {
	return []string{
		strconv.Itoa(r.Priority), prefixOrAll(r.From), prefixOrAll(r.To), tableName(r.Table), r.Owner,
		r.Status.Kind.String(), r.Status.GetError(),
	}
}

func tableName(t int) string {
	if t == MainTable {
		return "main"
	}
	return strconv.Itoa(t)
}

var (
	// RuleKeyIndex is the primary index of eni-rules.
	RuleKeyIndex = statedb.Index[*Rule, RuleKey]{
		Name: "key",
		FromObject: func(r *Rule) index.KeySet {
			return index.NewKeySet(r.RuleKey.indexKey())
		},
		FromKey: RuleKey.indexKey,
		FromString: func(s string) (index.Key, error) {
			k, err := ParseRuleKey(s)
			if err != nil {
				return nil, err
			}
			return k.indexKey(), nil
		},
		Unique: true,
	}
	// RulePodIndex finds the rules of a pod IP.
	RulePodIndex = statedb.Index[*Rule, netip.Addr]{
		Name: "pod",
		FromObject: func(r *Rule) index.KeySet {
			return index.NewKeySet(index.NetIPAddr(r.Pod))
		},
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
		Unique:     false,
	}
)

// NewRuleTable creates and registers the eni-rules table.
func NewRuleTable(db *statedb.DB) (statedb.RWTable[*Rule], error) {
	return statedb.NewTable(db, RuleTableName, RuleKeyIndex, RulePodIndex)
}

// RouteKey identifies a route: table and destination.
type RouteKey struct {
	Table int
	Dst   netip.Prefix
}

// String is the canonical form, also accepted by db/get: "table,dst".
func (k RouteKey) String() string { return fmt.Sprintf("%d,%s", k.Table, k.Dst) }

func (k RouteKey) indexKey() index.Key {
	key := binary.BigEndian.AppendUint32(make([]byte, 0, 4+18), uint32(k.Table))
	return appendPrefixKey(key, k.Dst)
}

// Route is a desired route of an ENI's table: the link route to the
// gateway (no Gateway, scope link) or the default route via the gateway.
type Route struct {
	RouteKey
	Gateway netip.Addr // invalid for the link route
	ENI     string
	MAC     string // the ENI link is found by MAC
	Status  reconciler.Status
}

func (r *Route) Family() int { return addrFamily(r.Dst.Addr()) }

func (r *Route) Clone() *Route { c := *r; return &c }

func (r *Route) GetStatus() reconciler.Status { return r.Status }

func (r *Route) SetStatus(s reconciler.Status) *Route {
	r.Status = s
	return r
}

func (r *Route) sameDesired(o *Route) bool {
	return r.RouteKey == o.RouteKey && r.Gateway == o.Gateway && r.ENI == o.ENI && r.MAC == o.MAC
}

func (r *Route) TableHeader() []string {
	return []string{"Table", "Destination", "Gateway", "ENI", "MAC", "Status", "Error"}
}

func (r *Route) TableRow() []string {
	gw := "-"
	if r.Gateway.IsValid() {
		gw = r.Gateway.String()
	}
	return []string{
		strconv.Itoa(r.Table), routeDst(r.Dst), gw, r.ENI, r.MAC,
		r.Status.Kind.String(), r.Status.GetError(),
	}
}

func routeDst(p netip.Prefix) string {
	if p.Bits() == 0 {
		return "default"
	}
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// RouteKeyIndex is the primary index of eni-routes.
var RouteKeyIndex = statedb.Index[*Route, RouteKey]{
	Name: "key",
	FromObject: func(r *Route) index.KeySet {
		return index.NewKeySet(r.RouteKey.indexKey())
	},
	FromKey: RouteKey.indexKey,
	FromString: func(s string) (index.Key, error) {
		t, dst, ok := strings.Cut(s, ",")
		if !ok {
			return nil, fmt.Errorf("route key %q: want table,dst", s)
		}
		table, err := strconv.Atoi(t)
		if err != nil {
			return nil, fmt.Errorf("route key %q: table: %w", s, err)
		}
		p, err := netip.ParsePrefix(dst)
		if err != nil {
			return nil, fmt.Errorf("route key %q: dst: %w", s, err)
		}
		return RouteKey{Table: table, Dst: p}.indexKey(), nil
	},
	Unique: true,
}

// NewRouteTable creates and registers the eni-routes table.
func NewRouteTable(db *statedb.DB) (statedb.RWTable[*Route], error) {
	return statedb.NewTable(db, RouteTableName, RouteKeyIndex)
}
