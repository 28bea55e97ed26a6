package source

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/enimasq/enimasq/cells/strictdecode"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The kinds of ClusterPolicyEndpoints (same API group and version as the
// PolicyEndpoints).
const (
	ClusterPolicyEndpointKind     = "ClusterPolicyEndpoint"
	clusterPolicyEndpointListKind = "ClusterPolicyEndpointList"
)

// ParseClusterPolicyEndpoints decodes and validates the ClusterPolicyEndpoints
// of a file, as ParsePolicyEndpoints does its PolicyEndpoints: the file may
// hold both kinds, and one error, of an object of either kind, fails it.
func ParseClusterPolicyEndpoints(path string, data []byte) ([]*ClusterPolicyEndpoint, error) {
	objs, err := parsePolicyFile(path, data)
	if err != nil {
		return nil, err
	}
	out := make([]*ClusterPolicyEndpoint, 0, len(objs))
	for _, o := range objs {
		if o.cpe != nil {
			out = append(out, o.cpe)
		}
	}
	return out, nil
}

// parseClusterObject decodes and validates one ClusterPolicyEndpoint object
// at base (the top level, or items[i] of a list). Errors past the header
// (apiVersion, kind, metadata) name the object.
func parseClusterObject(file string, base *field.Path, js []byte) (*ClusterPolicyEndpoint, error) {
	var obj clusterPolicyEndpointObject
	unknown, errs := decodeObject(base, js, &obj)
	v := &clusterValidator{cpe: &ClusterPolicyEndpoint{File: file}}
	if v.header(base, &obj); len(v.errs) > 0 {
		if len(errs) == 0 {
			errs = v.errs
		}
		return nil, strictdecode.Format(errs)
	}
	if len(errs) == 0 {
		v.spec(base.Child("spec"), obj.Spec)
		errs = v.errs
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", v.cpe.Name, strictdecode.Format(errs))
	}
	v.cpe.Warnings, v.cpe.Unknown = v.warnings, unknown
	return v.cpe, nil
}

// clusterValidator turns a decoded object into a ClusterPolicyEndpoint,
// with the field checks of a PolicyEndpoint (validator) for its pods,
// cidrs and ports.
type clusterValidator struct {
	validator
	cpe *ClusterPolicyEndpoint
}

// header checks apiVersion and kind and reads metadata.name. A
// ClusterPolicyEndpoint is cluster-scoped: a namespace is ignored, with a
// warning (as kubectl does). A name holds no '#', so that no valid object
// has the name of a stand-in ("FILE#DOCUMENT").
func (v *clusterValidator) header(base *field.Path, obj *clusterPolicyEndpointObject) {
	if obj.APIVersion != PolicyEndpointAPIVersion {
		v.fail(field.Invalid(base.Child("apiVersion"), obj.APIVersion, "is not "+PolicyEndpointAPIVersion))
	}
	if obj.Kind != ClusterPolicyEndpointKind {
		v.fail(field.Invalid(base.Child("kind"), obj.Kind, "is not "+ClusterPolicyEndpointKind))
	}
	name := base.Child("metadata", "name")
	if v.cpe.Name = v.objectName(name, obj.Metadata.Name); strings.Contains(v.cpe.Name, "#") {
		v.fail(field.Invalid(name, v.cpe.Name, "is not an object name (no '#')"))
	}
	if ns := obj.Metadata.Namespace; ns != "" {
		v.warn(base.Child("metadata", "namespace"), "%q ignored: a ClusterPolicyEndpoint is cluster-scoped", ns)
	}
}

func (v *clusterValidator) spec(path *field.Path, spec *clusterPolicyEndpointSpec) {
	if spec == nil {
		v.fail(field.Required(path, ""))
		return
	}
	if ref := path.Child("policyRef"); spec.PolicyRef == nil {
		v.fail(field.Required(ref, ""))
	} else {
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
	if !v.withinLimits(path, spec) {
		return
	}
	v.cpe.Pods = v.pods(path.Child("podSelectorEndpoints"), spec.PodSelectorEndpoints)
	v.cpe.Ingress = v.rules(path.Child("ingress"), spec.Ingress, "Ingress")
	v.cpe.Egress = v.rules(path.Child("egress"), spec.Egress, "Egress")
}

// withinLimits checks the object's size against the limits of one
// PolicyEndpoint, before anything is parsed.
func (v *clusterValidator) withinLimits(path *field.Path, spec *clusterPolicyEndpointSpec) bool {
	for _, c := range []struct {
		path   *field.Path
		what   string
		n, max int
	}{
		{path.Child("podSelectorEndpoints"), "pod IPs", len(spec.PodSelectorEndpoints), MaxPolicyEndpointPods},
		{path, "rules (ingress and egress)", len(spec.Ingress) + len(spec.Egress), MaxPolicyEndpointRules},
	} {
		if c.n > c.max {
			v.fail(field.TooMany(c.path, c.n, c.max))
			v.errs[len(v.errs)-1].Detail = fmt.Sprintf("%d %s, a ClusterPolicyEndpoint may have at most %d: split the policy", c.n, c.what, c.max)
		}
	}
	return len(v.errs) == 0
}

// actions are the rule actions of the CRD (ClusterNetworkPolicyRuleAction).
var actions = []string{string(endpoints.ActionAccept), string(endpoints.ActionDeny), string(endpoints.ActionPass)}

// rules reads the rules of a direction. Each needs an action. domainName
// is egress-only (the CRD's ClusterEndpointInfo), as for PolicyEndpoints:
// on an ingress entry it is an error. An egress entry without a cidr is
// skipped, with a warning: the AWS agent v1.5.0 skips it
// (controllers/clusterpolicyendpoints_controller.go, the egress loop of
// deriveClusterPolicyIngressAndEgressFirewallRules, line 425: "CIDR is
// empty, skipping the egress rule"); with a cidr, the cidr applies and the
// domainName is not enforced. An ingress entry needs a cidr.
func (v *clusterValidator) rules(path *field.Path, in []clusterEndpointInfo, dir string) []ClusterRule {
	var out []ClusterRule
	for i, r := range in {
		p := path.Index(i)
		action := v.action(p.Child("action"), r.Action)
		ports := v.ports(p.Child("ports"), r.Ports)
		switch {
		case r.DomainName != "" && dir == "Ingress":
			v.fail(field.Invalid(p.Child("domainName"), r.DomainName, "is for egress rules only"))
			continue
		case r.CIDR == "" && dir == "Egress":
			if r.DomainName != "" {
				v.warn(p, "domainName %q without a cidr: skipped, its %s applies to nothing (domain names are not enforced; the AWS agent skips the entry)", r.DomainName, r.Action)
			} else {
				v.warn(p, "no cidr: skipped, its %s applies to nothing (the AWS agent skips the entry)", r.Action)
			}
			continue
		case r.DomainName != "":
			v.warn(p.Child("domainName"), "%q is not enforced: the entry's cidr %s is", r.DomainName, r.CIDR)
		}
		cidr := v.prefix(p.Child("cidr"), r.CIDR)
		if cidr.IsValid() && action != "" {
			out = append(out, ClusterRule{CIDR: cidr, Ports: ports, Action: action})
		}
	}
	return out
}

// action reads a rule's action: Accept, Deny or Pass, as the CRD's enum
// (case-sensitive); empty after an error.
func (v *clusterValidator) action(path *field.Path, s string) endpoints.Action {
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
