package endpoints

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// One table per kind, written once. A kind is its row type (kind_pe.go,
// kind_cpe.go), which says what its object means, and a Kind, which is its
// table: the name, the indexes (by key, by pod IP, by parent policy) and
// the cell that provides it, the same for every kind. What the code
// written once for every kind (here, the source's fail-closed recovery,
// the union of slices, the compiler's deriver) needs of a row is Row
// (Object as a value).

// Object is a row of any kind, as a value (the source holds the rows of
// every kind of a file in one list).
type Object interface {
	Key() string
	// Parent is the policy the object is a slice of (Slice).
	Parent() string
	PodEntry(netip.Addr) (PodEndpoint, bool)
	// PodEntries are the pods the object lists, one per pod IP.
	PodEntries() []PodEndpoint
	// Common points at the fields every kind's row has.
	Common() Common
	statedb.TableWritable
}

// Row is a row of any kind, as a type parameter: an Object and a Slice.
type Row interface {
	comparable
	Object
}

// Common points at the fields every kind's row has besides its policy
// (its identity and its rules are the kind's own): where it was read, the
// pods it lists, what is odd about it, and whether it is the object as
// written.
type Common struct {
	File     *string
	Pods     *[]PodEndpoint
	Warnings *[]string
	Unknown  *[]string
	Invalid  *string
	StandIn  *bool
}

// Kind is the table of one kind of row.
type Kind[T Row] struct {
	TableName string
	// NameIndex is the primary index: the key (Key).
	NameIndex statedb.Index[T, string]
	// PodIndex finds the objects that select a pod IP.
	PodIndex statedb.Index[T, netip.Addr]
	// ParentIndex finds the slices of a policy by its Parent.
	ParentIndex statedb.Index[T, string]
}

// newKind is the table named table of rows T.
func newKind[T Row](table string) Kind[T] {
	return Kind[T]{
		TableName: table,
		NameIndex: statedb.Index[T, string]{
			Name: "name",
			FromObject: func(o T) index.KeySet {
				return index.NewKeySet(index.String(o.Key()))
			},
			FromKey:    index.String,
			FromString: index.FromString,
			Unique:     true,
		},
		PodIndex: statedb.Index[T, netip.Addr]{
			Name: "pod",
			FromObject: func(o T) index.KeySet {
				pods := o.PodEntries()
				keys := make([]index.Key, 0, len(pods))
				for _, p := range pods {
					keys = append(keys, index.NetIPAddr(p.PodIP))
				}
				return index.NewKeySet(keys...)
			},
			FromKey:    index.NetIPAddr,
			FromString: index.NetIPAddrString,
			Unique:     false,
		},
		ParentIndex: parentIndex[T](),
	}
}

// NewTable creates and registers the kind's table.
func (k Kind[T]) NewTable(db *statedb.DB) (statedb.RWTable[T], error) {
	return statedb.NewTable(db, k.TableName, k.NameIndex, k.PodIndex, k.ParentIndex)
}

// Cell provides the kind's table, written by one writer (the source, or a
// test that plays it), and read by all.
func (k Kind[T]) Cell() cell.Cell {
	return cell.Group(
		cell.ProvidePrivate(k.NewTable),
		cell.Provide(statedb.RWTable[T].ToTable),
	)
}

// PodEndpoint is a pod an object selects, by IP.
type PodEndpoint struct {
	Name      string
	Namespace string
	PodIP     netip.Addr
	// HostIP is the node's IP, always allowed (kubelet probes); invalid when
	// not given.
	HostIP netip.Addr
}

// Port is a protocol and a port or port range.
type Port struct {
	// Protocol is policybpf.ProtocolTCP, policybpf.ProtocolUDP or policybpf.ProtocolSCTP.
	Protocol uint32
	// Port 0 allows every port of the protocol.
	Port uint16 `json:",omitempty"`
	// EndPort 0 allows Port only.
	EndPort uint16 `json:",omitempty"`
}

func (p Port) String() string {
	return policybpf.PortEntry{Protocol: p.Protocol, StartPort: uint32(p.Port), EndPort: uint32(p.EndPort)}.String()
}

// podIPs are the pod IPs of pods.
func podIPs(pods []PodEndpoint) []netip.Addr {
	out := make([]netip.Addr, len(pods))
	for i, p := range pods {
		out[i] = p.PodIP
	}
	return out
}

// podEntry is the entry of pods for a pod IP.
func podEntry(pods []PodEndpoint, pod netip.Addr) (PodEndpoint, bool) {
	for _, p := range pods {
		if p.PodIP == pod {
			return p, true
		}
	}
	return PodEndpoint{}, false
}

// samePolicy reports whether two versions of an object compile alike for
// the pods they both list: they differ at most in their pods and in what
// does not compile (file, warnings, unknown fields, error text).
func samePolicy[R any, T interface {
	*R
	Row
}](a, b T) bool {
	ca, cb := *a, *b
	for _, c := range []Common{T(&ca).Common(), T(&cb).Common()} {
		*c.Pods, *c.File, *c.Warnings, *c.Unknown, *c.Invalid = nil, "", nil, nil, ""
	}
	return reflect.DeepEqual(ca, cb)
}

// warningsText is a row's Warnings column: its warnings, then its unknown
// fields.
func warningsText(warnings, unknown []string) string {
	out := slices.Clone(warnings)
	for _, f := range unknown {
		out = append(out, f+": unknown field, ignored")
	}
	return strings.Join(out, "; ")
}

// shownPods is how many pod IPs a table row lists before "and N more".
const shownPods = 4

// podList is the pod IPs as a row shows them: the first few, then sep and
// "and N more"; "-" for none.
func podList(pods []PodEndpoint, sep string) string {
	if len(pods) == 0 {
		return "-"
	}
	var ips []string
	for i, p := range pods {
		if i == shownPods {
			return fmt.Sprintf("%s%sand %d more", strings.Join(ips, ","), sep, len(pods)-shownPods)
		}
		ips = append(ips, p.PodIP.String())
	}
	return strings.Join(ips, ",")
}

// egressText is a row's Egress column: its rules, and its name rules if
// any.
func egressText(rules, names int) string {
	if names == 0 {
		return fmt.Sprintf("%d rules", rules)
	}
	return fmt.Sprintf("%d rules, %d names", rules, names)
}
