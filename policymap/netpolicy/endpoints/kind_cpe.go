package endpoints

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// ClusterPolicyEndpointsTableName is the table of ClusterPolicyEndpoint
// objects in effect.
const ClusterPolicyEndpointsTableName = "cluster-policy-endpoints"

// Tier is a ClusterPolicyEndpoint's tier: the Admin tier decides before the
// NetworkPolicy (PolicyEndpoints), the Baseline tier after it, for the pods
// no NetworkPolicy isolates.
type Tier string

const (
	TierAdmin    Tier = "Admin"
	TierBaseline Tier = "Baseline"
)

// Action is what a ClusterPolicyEndpoint rule does with what it matches.
type Action string

const (
	ActionAccept Action = "Accept"
	ActionDeny   Action = "Deny"
	// ActionPass hands the packet to the next step: from the Admin tier
	// to the NetworkPolicy, from the Baseline tier to the default.
	ActionPass Action = "Pass"
)

// MaxClusterPriority is the largest priority of a ClusterPolicyEndpoint.
const MaxClusterPriority = 1000

// ClusterPolicyEndpoint is one validated ClusterPolicyEndpoint object
// (networking.k8s.aws/v1alpha1, cluster-scoped): the pods of this node a
// ClusterNetworkPolicy selects, its tier and priority, and its rules, as the
// AWS network policy controller writes them. Objects in the table are
// immutable.
type ClusterPolicyEndpoint struct {
	Name string
	// File is the file the object was read from ("" from the API server).
	File string
	// PolicyRef is spec.policyRef.name, the ClusterNetworkPolicy.
	PolicyRef string
	Tier      Tier
	// Priority is spec.priority, 0 to MaxClusterPriority: within a tier a
	// lower number decides first.
	Priority int32
	// Pods are spec.podSelectorEndpoints on this node, one per pod IP.
	Pods    []PodEndpoint
	Ingress []ClusterRule `json:",omitempty"`
	Egress  []ClusterRule `json:",omitempty"`
	// EgressNames are the egress entries whose peer is a domain name
	// (names.go), each with its action.
	EgressNames []NameRule `json:",omitempty"`
	// Warnings are accepted oddities, each naming the field.
	Warnings []string `json:",omitempty"`
	// Unknown are the paths of the fields the object has that enimasq
	// does not know (a newer controller's: spec.subject of v1.1.10's
	// ClusterPolicyEndpoints): ignored, as a Kubernetes client ignores
	// them, and named (the row's warnings, the source's log and health,
	// enimasq_policy_unknown_fields_total).
	Unknown []string `json:",omitempty"`
	// Invalid, when set, is why the object in force is not the one written:
	// the row is its last good version or, with none, its stand-in, which
	// denies everything but the node IP to the pods it names, in both
	// directions, at the top of the Admin tier (never more open than
	// before). A stand-in whose name cannot be read has the Name
	// "FILE#DOCUMENT".
	Invalid string `json:",omitempty"`
	// StandIn: the object is a stand-in, not a version of the object.
	StandIn bool `json:"-" yaml:"-"`
}

// ClusterRule is one ingress or egress entry: peers in CIDR on Ports get
// Action. Rules of another family than a pod's are inert for it.
type ClusterRule struct {
	CIDR netip.Prefix
	// Ports empty matches every protocol and port.
	Ports  []Port `json:",omitempty"`
	Action Action
}

// ClusterPolicyEndpoints is the cluster-policy-endpoints table.
var ClusterPolicyEndpoints = newKind[*ClusterPolicyEndpoint](ClusterPolicyEndpointsTableName)

var (
	// ClusterPolicyEndpointNameIndex is the primary index: the name.
	ClusterPolicyEndpointNameIndex = ClusterPolicyEndpoints.NameIndex
	// ClusterPolicyEndpointPodIndex finds the objects that select a pod IP.
	ClusterPolicyEndpointPodIndex = ClusterPolicyEndpoints.PodIndex
	// ClusterPolicyEndpointParentIndex finds the slices of a
	// ClusterNetworkPolicy by its name (Parent).
	ClusterPolicyEndpointParentIndex = ClusterPolicyEndpoints.ParentIndex
)

// NewClusterPolicyEndpointsTable creates and registers
// cluster-policy-endpoints.
func NewClusterPolicyEndpointsTable(db *statedb.DB) (statedb.RWTable[*ClusterPolicyEndpoint], error) {
	return ClusterPolicyEndpoints.NewTable(db)
}

// Key is the table's primary key: the object's name (cluster-scoped).
func (c *ClusterPolicyEndpoint) Key() string { return c.Name }

// Parent is the ClusterNetworkPolicy the object is a slice of, its
// PolicyRef: a pod that one slice lists gets the rules of all of them, each
// slice's with its own tier and priority (slices.go). "" for a stand-in
// whose policyRef cannot be read.
func (c *ClusterPolicyEndpoint) Parent() string { return c.PolicyRef }

// Common points at the fields every kind's row has.
func (c *ClusterPolicyEndpoint) Common() Common {
	return Common{File: &c.File, Pods: &c.Pods, Warnings: &c.Warnings, Unknown: &c.Unknown, Invalid: &c.Invalid, StandIn: &c.StandIn}
}

// PodEntries are the pods the object lists.
func (c *ClusterPolicyEndpoint) PodEntries() []PodEndpoint { return c.Pods }

// PodIPs are the pod IPs the object lists.
func (c *ClusterPolicyEndpoint) PodIPs() []netip.Addr { return podIPs(c.Pods) }

// SamePolicy reports whether o is c with other pods at most (see
// PolicyEndpoint.SamePolicy).
func (c *ClusterPolicyEndpoint) SamePolicy(o *ClusterPolicyEndpoint) bool { return samePolicy(c, o) }

// Rules returns the rules of a direction.
func (c *ClusterPolicyEndpoint) Rules(d policybpf.Direction) []ClusterRule {
	if d == policybpf.Ingress {
		return c.Ingress
	}
	return c.Egress
}

// NameRules are the object's egress entries with a domain name.
func (c *ClusterPolicyEndpoint) NameRules() []NameRule { return c.EgressNames }

// WithNameIPs returns the object with its name rules replaced by rules of
// one address each, the addresses ips gives a rule, with the rule's ports
// and action; the object itself if it has no name rules.
func (c *ClusterPolicyEndpoint) WithNameIPs(ips func(NameRule) []netip.Addr) *ClusterPolicyEndpoint {
	if len(c.EgressNames) == 0 {
		return c
	}
	o := *c
	o.Egress = slices.Clone(c.Egress)
	for _, r := range c.EgressNames {
		for _, ip := range ips(r) {
			o.Egress = append(o.Egress, ClusterRule{CIDR: netip.PrefixFrom(ip, ip.BitLen()), Ports: r.Ports, Action: r.Action})
		}
	}
	o.EgressNames = nil
	return &o
}

// PodEntry returns the object's entry for a pod IP.
func (c *ClusterPolicyEndpoint) PodEntry(pod netip.Addr) (PodEndpoint, bool) {
	return podEntry(c.Pods, pod)
}

func (c *ClusterPolicyEndpoint) TableHeader() []string {
	return []string{"Name", "Policy", "Tier", "Priority", "Pods", "Ingress", "Egress", "Warnings", "Error"}
}

func (c *ClusterPolicyEndpoint) TableRow() []string {
	return []string{
		c.Name,
		c.PolicyRef,
		string(c.Tier),
		fmt.Sprint(c.Priority),
		podList(c.Pods, ","),
		fmt.Sprintf("%d rules", len(c.Ingress)),
		egressText(len(c.Egress), len(c.EgressNames)),
		warningsText(c.Warnings, c.Unknown),
		c.Invalid,
	}
}
