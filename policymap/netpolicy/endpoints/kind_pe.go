package endpoints

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// PolicyEndpointsTableName is the table of PolicyEndpoint objects in effect.
const PolicyEndpointsTableName = "policy-endpoints"

// PolicyEndpoint is one validated PolicyEndpoint object
// (networking.k8s.aws/v1alpha1): the pods a NetworkPolicy selects on this
// node and its rules, as the AWS network policy controller writes them.
// Objects in the table are immutable.
type PolicyEndpoint struct {
	Namespace string
	Name      string
	// File is the file the object was read from.
	File string
	// PolicyRef is the NetworkPolicy, "namespace/name".
	PolicyRef string
	// IsolatesIngress and IsolatesEgress come from spec.podIsolation: the
	// selected pods allow only what the rules of a direction they are
	// isolated in allow.
	IsolatesIngress bool
	IsolatesEgress  bool
	// Pods are spec.podSelectorEndpoints, one per pod IP (a dual-stack pod
	// is listed once per family).
	Pods    []PodEndpoint
	Ingress []Rule
	Egress  []Rule
	// EgressNames are the egress entries whose peer is a domain name
	// (names.go): they allow what the pods were told the names are.
	EgressNames []NameRule `json:",omitempty"`
	// Warnings are accepted oddities, each naming the field: items of
	// another family dropped, host bits cleared, excepts outside their
	// cidr, duplicates.
	Warnings []string `json:",omitempty"`
	// Unknown are the paths of the fields the object has that enimasq
	// does not know (a newer controller's: spec.subject of v1.1.10's
	// ClusterPolicyEndpoints): ignored, as a Kubernetes client ignores
	// them, and named (the row's warnings, the source's log and health,
	// enimasq_policy_unknown_fields_total).
	Unknown []string `json:",omitempty"`
	// Invalid, when set, is why the object in force is not the one written
	// (its error): the row is its last good version or, with none, its
	// stand-in (the source's recover.go), which isolates the pods it names
	// and allows nothing. A stand-in whose name cannot be read has no
	// Namespace and a Name "FILE#DOCUMENT".
	Invalid string `json:",omitempty"`
	// StandIn: the object is a stand-in, not a version of the object. Not
	// shown: Invalid and Warnings say so.
	StandIn bool `json:"-" yaml:"-"`
}

// Rule is one ingress or egress rule: peers in CIDR but in none of Except
// may use Ports. Except holds only prefixes of CIDR's family strictly
// inside CIDR or covering it.
type Rule struct {
	CIDR   netip.Prefix
	Except []netip.Prefix `json:",omitempty"`
	// Ports empty allows every protocol and port.
	Ports []Port `json:",omitempty"`
}

// PolicyEndpoints is the policy-endpoints table.
var PolicyEndpoints = newKind[*PolicyEndpoint](PolicyEndpointsTableName)

var (
	// PolicyEndpointNameIndex is the primary index: "namespace/name".
	PolicyEndpointNameIndex = PolicyEndpoints.NameIndex
	// PolicyEndpointPodIndex finds the objects that select a pod IP.
	PolicyEndpointPodIndex = PolicyEndpoints.PodIndex
	// PolicyEndpointParentIndex finds the slices of a NetworkPolicy by
	// its "namespace/name" (Parent).
	PolicyEndpointParentIndex = PolicyEndpoints.ParentIndex
)

// NewPolicyEndpointsTable creates and registers policy-endpoints.
func NewPolicyEndpointsTable(db *statedb.DB) (statedb.RWTable[*PolicyEndpoint], error) {
	return PolicyEndpoints.NewTable(db)
}

// Key is "namespace/name", the table's primary key; a stand-in whose name
// cannot be read has the key "FILE#DOCUMENT", which no valid object has.
func (pe *PolicyEndpoint) Key() string {
	if pe.Namespace == "" {
		return pe.Name
	}
	return pe.Namespace + "/" + pe.Name
}

// Parent is the policy the object is a slice of: the controller cuts a
// NetworkPolicy into slices, and a pod that one slice lists gets the rules
// of all of them (slices.go). It is policyRef.name in the object's own
// namespace, whatever policyRef.namespace says, as the AWS agent v1.5.0
// lists the slices of a policy (derivePolicyEndpointsOfParentNP): an
// object in another namespace never joins a policy. "" for a stand-in
// whose policyRef cannot be read: a policy of its own.
func (pe *PolicyEndpoint) Parent() string {
	if pe.PolicyRef == "" {
		return ""
	}
	return pe.Namespace + "/" + pe.PolicyRef[strings.LastIndexByte(pe.PolicyRef, '/')+1:]
}

// Common points at the fields every kind's row has.
func (pe *PolicyEndpoint) Common() Common {
	return Common{File: &pe.File, Pods: &pe.Pods, Warnings: &pe.Warnings, Unknown: &pe.Unknown, Invalid: &pe.Invalid, StandIn: &pe.StandIn}
}

// PodEntries are the pods the object lists.
func (pe *PolicyEndpoint) PodEntries() []PodEndpoint { return pe.Pods }

// PodIPs are the pod IPs the object lists.
func (pe *PolicyEndpoint) PodIPs() []netip.Addr { return podIPs(pe.Pods) }

// SamePolicy reports whether o is pe with other pods at most: a change
// from one to the other recompiles only the pods that come, go or change.
func (pe *PolicyEndpoint) SamePolicy(o *PolicyEndpoint) bool { return samePolicy(pe, o) }

// Rules returns the rules of a direction.
func (pe *PolicyEndpoint) Rules(d policybpf.Direction) []Rule {
	if d == policybpf.Ingress {
		return pe.Ingress
	}
	return pe.Egress
}

// NameRules are the object's egress entries with a domain name.
func (pe *PolicyEndpoint) NameRules() []NameRule { return pe.EgressNames }

// WithNameIPs returns the object with its name rules replaced by CIDR
// rules of one address each, the addresses ips gives a rule, with the
// rule's ports; the object itself if it has no name rules.
func (pe *PolicyEndpoint) WithNameIPs(ips func(NameRule) []netip.Addr) *PolicyEndpoint {
	if len(pe.EgressNames) == 0 {
		return pe
	}
	c := *pe
	c.Egress = slices.Clone(pe.Egress)
	for _, r := range pe.EgressNames {
		for _, ip := range ips(r) {
			c.Egress = append(c.Egress, Rule{CIDR: netip.PrefixFrom(ip, ip.BitLen()), Ports: r.Ports})
		}
	}
	c.EgressNames = nil
	return &c
}

// Isolates reports whether the selected pods are isolated in direction d.
func (pe *PolicyEndpoint) Isolates(d policybpf.Direction) bool {
	if d == policybpf.Ingress {
		return pe.IsolatesIngress
	}
	return pe.IsolatesEgress
}

// Selects reports whether the object lists the pod IP.
func (pe *PolicyEndpoint) Selects(pod netip.Addr) bool {
	_, ok := podEntry(pe.Pods, pod)
	return ok
}

// PodEntry returns the object's entry for a pod IP.
func (pe *PolicyEndpoint) PodEntry(pod netip.Addr) (PodEndpoint, bool) { return podEntry(pe.Pods, pod) }

// Isolation names the directions the selected pods are isolated in
// ("Ingress,Egress"), or "-".
func (pe *PolicyEndpoint) Isolation() string {
	var dirs []string
	if pe.IsolatesIngress {
		dirs = append(dirs, "Ingress")
	}
	if pe.IsolatesEgress {
		dirs = append(dirs, "Egress")
	}
	if len(dirs) == 0 {
		return "-"
	}
	return strings.Join(dirs, ",")
}

// PodList is the pod IPs as the row shows them: the first few, "and N
// more", or "-".
func (pe *PolicyEndpoint) PodList() string { return podList(pe.Pods, " ") }

func (pe *PolicyEndpoint) TableHeader() []string {
	return []string{"Name", "Policy", "Isolation", "Pods", "Ingress", "Egress", "Warnings", "Error"}
}

func (pe *PolicyEndpoint) TableRow() []string {
	return []string{
		pe.Key(),
		pe.PolicyRef,
		pe.Isolation(),
		pe.PodList(),
		fmt.Sprintf("%d rules", len(pe.Ingress)),
		egressText(len(pe.Egress), len(pe.EgressNames)),
		warningsText(pe.Warnings, pe.Unknown),
		pe.Invalid,
	}
}
