package endpoints

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// Domain names. The AWS network policy controller turns the domainNames
// egress peers of an ApplicationNetworkPolicy (and of a
// ClusterNetworkPolicy) into egress entries with a domainName and no cidr.
// An object keeps them as NameRules beside its CIDR rules. What a name
// stands for is learnt per pod: the fqdn part reads the answers to the
// pod's own DNS lookups and writes the names it was told, with their IPs
// and how long they hold, to the policy-fqdn table (DNSName rows). The
// compiler allows a pod, under a NameRule, the IPs of that pod's rows
// whose names the rule's pattern matches, as CIDR rules of one address
// each, with the rule's ports (and action): the same semantics as any
// other rule of its object.

// NameRule is an egress entry whose peer is a domain name.
type NameRule struct {
	// Pattern is the domainName in canonical form (CanonicalName): an
	// exact name, or "*." and a name for one or more whole labels before
	// it.
	Pattern string
	// Ports empty allows every protocol and port.
	Ports []Port `json:",omitempty"`
	// Action is a ClusterPolicyEndpoint rule's; "" for a PolicyEndpoint.
	Action Action `json:",omitempty"`
}

// Matches reports whether the rule's pattern matches a name: equal, or,
// for "*.suffix", one or more whole labels before suffix. Case and a
// trailing dot do not matter; a name with an escape (a "\." inside a label,
// a "\DDD" byte) matches nothing.
func (r NameRule) Matches(name string) bool { return MatchName(r.Pattern, name) }

// MatchName reports whether a canonical pattern matches a name.
func MatchName(pattern, name string) bool {
	if strings.ContainsRune(name, '\\') {
		return false // an escaped dot or byte: its labels are not what the text says
	}
	name = CanonicalName(name)
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix)
	}
	return name == pattern
}

// CanonicalName is a name as patterns and rows hold it: lower case,
// without the trailing dot.
func CanonicalName(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// domainNamePattern is the CRDs' pattern of a domainName (the controller
// v1.1.10's config/crd/bases, PolicyEndpoint and ClusterPolicyEndpoint):
// what the API server accepts, and so what an object may hold.
var domainNamePattern = regexp.MustCompile(`^(\*\.)?([a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$`)

// MaxDomainNameLength is the longest name DNS has (RFC 1035, 253
// characters in text without the trailing dot).
const MaxDomainNameLength = 253

// ParseDomainName checks a domainName against the CRD's pattern and
// returns its canonical form.
func ParseDomainName(s string) (string, error) {
	if len(s) > MaxDomainNameLength+1 || !domainNamePattern.MatchString(s) {
		return "", fmt.Errorf("is not a domain name: a name of two or more labels, optionally after \"*.\"")
	}
	return CanonicalName(s), nil
}

// DNSNamesTableName is the table of the names pods were told.
const DNSNamesTableName = "policy-fqdn"

// DNSName is what one pod was told a name stands for: the IPs of the
// answers to its lookups of the name that a NameRule selecting it
// matched, each until it expires. Written by the fqdn part alone; rows are
// immutable.
type DNSName struct {
	Pod netip.Addr
	// PodName is "namespace/name" of the pod that asked: a row counts
	// only for that pod, so a pod IP reused by another pod inherits
	// nothing.
	PodName string
	// Name is the name asked (the question), canonical.
	Name string
	// IPs are sorted by address, each with its expiry.
	IPs []NameIP
	// Rules are the entries that asked for the name: "kind object
	// pattern".
	Rules []string `json:",omitempty"`
}

// NameIP is one address of a name, until Expires.
type NameIP struct {
	IP      netip.Addr
	Expires time.Time
}

// Key is the row's primary key: the pod IP, then the name.
func (n *DNSName) Key() string { return dnsNameKey(n.Pod, n.Name) }

func dnsNameKey(pod netip.Addr, name string) string { return pod.String() + "|" + name }

// Addrs are the row's IPs, sorted.
func (n *DNSName) Addrs() []netip.Addr {
	out := make([]netip.Addr, len(n.IPs))
	for i, ip := range n.IPs {
		out[i] = ip.IP
	}
	return out
}

// SameIPs reports whether two rows hold the same addresses (whatever their
// expiries): what the compiler reads of a row.
func (n *DNSName) SameIPs(o *DNSName) bool {
	return n.PodName == o.PodName && slices.EqualFunc(n.IPs, o.IPs, func(a, b NameIP) bool { return a.IP == b.IP })
}

func (n *DNSName) TableHeader() []string {
	return []string{"Pod", "PodName", "Name", "IPs", "Expires", "Rules"}
}

// TableRow shows the expiries as times (they are the row's data, not a
// status).
func (n *DNSName) TableRow() []string {
	var ips, exp []string
	for _, ip := range n.IPs {
		ips = append(ips, ip.IP.String())
		exp = append(exp, ip.Expires.UTC().Format(time.RFC3339))
	}
	return []string{n.Pod.String(), n.PodName, n.Name, strings.Join(ips, ","), strings.Join(exp, ","), strings.Join(n.Rules, "; ")}
}

var (
	// DNSNameKeyIndex is the primary index: pod IP and name (Key).
	DNSNameKeyIndex = statedb.Index[*DNSName, string]{
		Name: "key",
		FromObject: func(n *DNSName) index.KeySet {
			return index.NewKeySet(index.String(n.Key()))
		},
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// DNSNamePodIndex finds a pod IP's rows.
	DNSNamePodIndex = statedb.Index[*DNSName, netip.Addr]{
		Name: "pod",
		FromObject: func(n *DNSName) index.KeySet {
			return index.NewKeySet(index.NetIPAddr(n.Pod))
		},
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
		Unique:     false,
	}
)

// DNSNameQuery finds the row of a pod IP and a canonical name.
func DNSNameQuery(pod netip.Addr, name string) statedb.Query[*DNSName] {
	return DNSNameKeyIndex.Query(dnsNameKey(pod, name))
}

// NewDNSNamesTable creates and registers policy-fqdn.
func NewDNSNamesTable(db *statedb.DB) (statedb.RWTable[*DNSName], error) {
	return statedb.NewTable(db, DNSNamesTableName, DNSNameKeyIndex, DNSNamePodIndex)
}

// DNSNamesCell provides policy-fqdn, written by one writer (the fqdn part,
// or a test that plays it), and read by all. Without it (linked into
// Cilium) name rules allow nothing.
var DNSNamesCell = cell.Group(
	cell.ProvidePrivate(NewDNSNamesTable),
	cell.Provide(statedb.RWTable[*DNSName].ToTable),
)

// IPsFor returns the addresses of family-matching rows that a rule
// allows to a pod: those of the rows of pod (its rows, read in order)
// whose PodName is podName and whose Name the rule matches, sorted,
// without repeats.
func IPsFor(rows []*DNSName, podName string, r NameRule) []netip.Addr {
	var out []netip.Addr
	for _, row := range rows {
		if row.PodName != podName || !r.Matches(row.Name) {
			continue
		}
		out = append(out, row.Addrs()...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
