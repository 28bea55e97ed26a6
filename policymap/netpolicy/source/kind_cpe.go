package source

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The kinds of ClusterPolicyEndpoints (same API group and version as the
// PolicyEndpoints).
const (
	ClusterPolicyEndpointKind     = "ClusterPolicyEndpoint"
	clusterPolicyEndpointListKind = "ClusterPolicyEndpointList"
)

// ClusterPolicyEndpoints is the resource of ClusterPolicyEndpoints:
// cluster-scoped, read whole (the ClusterRole of
// Documentation/deploy/network-policy grants get, list and watch).
var ClusterPolicyEndpoints = schema.GroupVersionResource{Group: "networking.k8s.aws", Version: "v1alpha1", Resource: "clusterpolicyendpoints"}

// ClusterScope is the health scope, below the source's job, of
// cluster-policy-endpoints.
const ClusterScope = "cluster-policy-endpoints"

// clusterPolicyEndpoints is the kind ClusterPolicyEndpoint (cluster-scoped):
// the pods a ClusterNetworkPolicy selects, its tier and priority, and what
// its rules do with their peers. Its stand-in denies the pods it names
// everything but their node, in both directions, at the top of the Admin
// tier (Admin, 0), whatever the object wrote. The API server may not serve
// the kind (the CRD is not installed in a cluster without
// ClusterNetworkPolicies): while no object was ever seen, that is no
// objects, so that the NetworkPolicies are enforced; once the CRD is
// installed the informer's relist finds its objects.
var clusterPolicyEndpoints = &kind[ClusterPolicyEndpoint, *ClusterPolicyEndpoint]{
	name:        ClusterPolicyEndpointKind,
	list:        clusterPolicyEndpointListKind,
	named:       regexp.MustCompile(`\bClusterPolicyEndpoint`),
	resource:    ClusterPolicyEndpoints,
	optionalCRD: true,
	scope:       ClusterScope,
	fate:        "denied everything but their node",
	table:       endpoints.ClusterPolicyEndpoints,
	decode: func(file string, base *field.Path, js []byte) (*ClusterPolicyEndpoint, error) {
		return decodeWith(base, js, &cpeValidator{cpe: &ClusterPolicyEndpoint{File: file}})
	},
	lenient: lenientClusterPolicyEndpoint,
	failClosed: func(cpe *ClusterPolicyEndpoint) string {
		cpe.Tier, cpe.Priority = endpoints.TierAdmin, 0
		cpe.Ingress, cpe.Egress, cpe.EgressNames = nil, nil, nil
		return "denied everything but their node, in both directions, at the top of the Admin tier"
	},
	forNode: forNode,
}

// ParseClusterPolicyEndpoints decodes and validates the ClusterPolicyEndpoints
// of a file, as ParsePolicyEndpoints does its PolicyEndpoints: the file may
// hold both kinds, and one error, of an object of either kind, fails it.
func ParseClusterPolicyEndpoints(path string, data []byte) ([]*ClusterPolicyEndpoint, error) {
	return parseAll[*ClusterPolicyEndpoint](path, data)
}

// cpeValidator turns a decoded object into a ClusterPolicyEndpoint, with
// the field checks of every kind (validator) for its pods, cidrs and
// ports.
type cpeValidator struct {
	validator
	cpe *ClusterPolicyEndpoint
}

func (v *cpeValidator) row() *ClusterPolicyEndpoint { return v.cpe }

// header checks apiVersion and kind and reads metadata.name. A
// ClusterPolicyEndpoint is cluster-scoped: a namespace is ignored, with a
// warning (as kubectl does). A name holds no '#', so that no valid object
// has the name of a stand-in ("FILE#DOCUMENT").
func (v *cpeValidator) header(base *field.Path, obj *clusterPolicyEndpointObject) {
	v.typeMeta(base, obj.APIVersion, obj.Kind, ClusterPolicyEndpointKind)
	name := base.Child("metadata", "name")
	if v.cpe.Name = v.objectName(name, obj.Metadata.Name); strings.Contains(v.cpe.Name, "#") {
		v.fail(field.Invalid(name, v.cpe.Name, "is not an object name (no '#')"))
	}
	if ns := obj.Metadata.Namespace; ns != "" {
		v.warn(base.Child("metadata", "namespace"), "%q ignored: a ClusterPolicyEndpoint is cluster-scoped", ns)
	}
}

func (v *cpeValidator) spec(path *field.Path, obj *clusterPolicyEndpointObject) {
	spec := obj.Spec
	if !v.present(path, spec != nil) {
		return
	}
	if ref := path.Child("policyRef"); v.present(ref, spec.PolicyRef != nil) {
		v.cpe.PolicyRef = v.objectName(ref.Child("name"), spec.PolicyRef.Name)
	}
	if p := path.Child("tier"); v.required(p, spec.Tier) {
		switch t := endpoints.Tier(spec.Tier); t {
		case endpoints.TierAdmin, endpoints.TierBaseline:
			v.cpe.Tier = t
		default:
			v.fail(field.Invalid(p, spec.Tier, "is not Admin or Baseline"))
		}
	}
	// The priority is required (the CRD's, and 0 decides first: a missing
	// one must not be read as the strongest). In the Baseline tier the AWS
	// agent adds BASELINE_TIER_PRIORITY_OFFSET (its
	// controllers/clusterpolicyendpoints_controller.go,
	// deriveClusterPolicyIngressAndEgressFirewallRules): the compiler
	// orders the tiers, the row keeps the priority as written.
	if p := path.Child("priority"); spec.Priority == nil {
		v.fail(field.Required(p, fmt.Sprintf("want an integer 0..%d", endpoints.MaxClusterPriority)))
	} else if n := *spec.Priority; n < 0 || n > endpoints.MaxClusterPriority {
		v.fail(field.Invalid(p, n, fmt.Sprintf("is outside 0..%d", endpoints.MaxClusterPriority)))
	} else {
		v.cpe.Priority = int32(n)
	}
	if !v.withinLimits(ClusterPolicyEndpointKind,
		limit{path.Child("podSelectorEndpoints"), "pod IPs", len(spec.PodSelectorEndpoints), MaxPolicyEndpointPods},
		limit{path, "rules (ingress and egress)", len(spec.Ingress) + len(spec.Egress), MaxPolicyEndpointRules}) {
		return
	}
	v.cpe.Pods = v.pods(path.Child("podSelectorEndpoints"), spec.PodSelectorEndpoints)
	v.cpe.Ingress, _ = v.rules(path.Child("ingress"), spec.Ingress, "Ingress")
	v.cpe.Egress, v.cpe.EgressNames = v.rules(path.Child("egress"), spec.Egress, "Egress")
}

// actions are the rule actions of the CRD (ClusterNetworkPolicyRuleAction).
var actions = []string{string(endpoints.ActionAccept), string(endpoints.ActionDeny), string(endpoints.ActionPass)}

// rules reads the rules of a direction. Each needs an action. domainName
// is egress-only (the CRD's ClusterEndpointInfo), as for PolicyEndpoints:
// on an ingress entry it is an error. An egress entry with a domainName and
// no cidr (a ClusterNetworkPolicy's domainNames peer) is a name rule,
// returned apart, with its action; one with neither is skipped, with a
// warning, as the AWS agent v1.5.0 skips both
// (controllers/clusterpolicyendpoints_controller.go, the egress loop of
// deriveClusterPolicyIngressAndEgressFirewallRules: "CIDR is empty,
// skipping the egress rule"); with a cidr, the cidr applies and the
// domainName is not enforced. An ingress entry needs a cidr.
func (v *cpeValidator) rules(path *field.Path, in []clusterEndpointInfo, dir string) ([]ClusterRule, []endpoints.NameRule) {
	var out []ClusterRule
	var names []endpoints.NameRule
	for i, r := range in {
		p := path.Index(i)
		action := v.action(p.Child("action"), r.Action)
		ports := v.ports(p.Child("ports"), r.Ports)
		read, name := v.peer(p, dir, r.CIDR, r.DomainName, fmt.Sprintf("skipped, its %s applies to nothing", r.Action))
		switch {
		case name != "" && action == endpoints.ActionDeny:
			// The pod decides what it learns, and when it forgets: a flood
			// of names, or the TTL run out, would lift the Deny.
			v.fail(field.Invalid(p.Child("action"), string(action), "is not allowed on a domainName entry, which may Accept or Pass only (a Deny of the names a pod learns could be lifted by the pod itself)"))
		case name != "" && action != "":
			names = append(names, endpoints.NameRule{Pattern: name, Ports: ports, Action: action})
		}
		if !read {
			continue
		}
		cidr := v.prefix(p.Child("cidr"), r.CIDR)
		if cidr.IsValid() && action != "" {
			out = append(out, ClusterRule{CIDR: cidr, Ports: ports, Action: action})
		}
	}
	return out, names
}

// action reads a rule's action: Accept, Deny or Pass, as the CRD's enum
// (case-sensitive); empty after an error.
func (v *cpeValidator) action(path *field.Path, s string) endpoints.Action {
	if !v.required(path, s) {
		return ""
	}
	for _, a := range actions {
		if s == a {
			return endpoints.Action(a)
		}
	}
	v.fail(field.Invalid(path, s, "is not Accept, Deny or Pass"))
	return ""
}

// lenientClusterPolicyEndpoint is what the stand-in of a
// ClusterPolicyEndpoint reads (recover.go), besides its pods:
//
//   - metadata.name, for the key; when it cannot be read, the name is
//     "FILE#DOCUMENT" (with ".items[I]" for an item of a list), which no
//     valid object has (a valid name holds no '#');
//   - spec.policyRef.name, for the row.
func lenientClusterPolicyEndpoint(file, name, key string, meta, spec map[string]any) *ClusterPolicyEndpoint {
	cpe := &ClusterPolicyEndpoint{File: file, Name: name}
	if n := str(meta, "name"); validName(n) && !strings.Contains(n, "#") {
		cpe.Name = n
	}
	if key != "" {
		cpe.Name = key
	}
	if ref, _ := spec["policyRef"].(map[string]any); validName(str(ref, "name")) {
		cpe.PolicyRef = str(ref, "name")
	}
	return cpe
}

// forNode is cpe without what this node does not program, each item
// dropped with a warning on the row: the pod IPs and the rules of a family
// it does not run (an IPv6 cidr on an IPv4-only node is inert: never an
// error, never encoded). cpe itself is returned when nothing is dropped.
func forNode(cpe *ClusterPolicyEndpoint, node nodeconfig.Config) *ClusterPolicyEndpoint {
	var warnings []string
	pods := slices.DeleteFunc(slices.Clone(cpe.Pods), func(p PodEndpoint) bool {
		if node.FamilyEnabled(p.PodIP) {
			return false
		}
		warnings = append(warnings, fmt.Sprintf("spec.podSelectorEndpoints: podIP %s: %s: dropped", p.PodIP, familyDisabled(p.PodIP)))
		return true
	})
	rules := func(d policybpf.Direction, in []ClusterRule) []ClusterRule {
		var out []ClusterRule
		for _, r := range in {
			if node.FamilyEnabled(r.CIDR.Addr()) {
				out = append(out, r)
				continue
			}
			warnings = append(warnings, fmt.Sprintf("spec.%s: cidr %s (%s): %s: rule dropped", d, r.CIDR, r.Action, familyDisabled(r.CIDR.Addr())))
		}
		return out
	}
	ingress, egress := rules(policybpf.Ingress, cpe.Ingress), rules(policybpf.Egress, cpe.Egress)
	if len(warnings) == 0 {
		return cpe
	}
	c := withWarnings(cpe, warnings...)
	c.Pods, c.Ingress, c.Egress = pods, ingress, egress
	return c
}
