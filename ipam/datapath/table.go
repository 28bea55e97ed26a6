package datapath

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

// Table names.
const (
	RuleTableName  = "eni-rules"
	RouteTableName = "eni-routes"
)

// Rule priorities, as in Cilium's ENI mode (linux_defaults.RulePriorityIngress,
// RulePriorityEgressv2).
const (
	// RulePriorityIngress: "to <pod> lookup main", so that traffic to the
	// pod is routed by the main table whatever its source.
	RulePriorityIngress = 20
	// RulePriorityEgress: "from <pod> [to <cidr>] lookup <10+number>".
	RulePriorityEgress = 111
	// MainTable is the main routing table.
	MainTable = 254
)

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
