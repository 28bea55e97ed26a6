package source

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The kinds of PolicyEndpoints.
const (
	PolicyEndpointKind     = "PolicyEndpoint"
	policyEndpointListKind = "PolicyEndpointList"
)

// policyEndpoints is the kind PolicyEndpoint: the pods a NetworkPolicy
// selects, isolated in the directions it names, and the peers their rules
// allow. Its stand-in isolates the pods it names in the directions it
// names (both when they cannot be read), allowing nothing but their node.
var policyEndpoints = &kind[PolicyEndpoint, *PolicyEndpoint]{
	name:       PolicyEndpointKind,
	list:       policyEndpointListKind,
	named:      regexp.MustCompile(`(^|[^A-Za-z0-9_])PolicyEndpoint`),
	resource:   k8sclient.PolicyEndpoints,
	namespaced: true,
	fate:       "isolated",
	table:      endpoints.PolicyEndpoints,
	decode: func(file string, base *field.Path, js []byte) (*PolicyEndpoint, error) {
		return decodeWith(base, js, &peValidator{pe: &PolicyEndpoint{File: file}})
	},
	lenient: lenientPolicyEndpoint,
	failClosed: func(pe *PolicyEndpoint) string {
		pe.Ingress, pe.Egress, pe.EgressNames = nil, nil, nil
		return fmt.Sprintf("isolated in %s, allowing nothing but their node", pe.Isolation())
	},
	join: func(stand, c *PolicyEndpoint) {
		stand.IsolatesIngress = stand.IsolatesIngress || c.IsolatesIngress
		stand.IsolatesEgress = stand.IsolatesEgress || c.IsolatesEgress
	},
	forNode: func(pe *PolicyEndpoint, node nodeconfig.Config) *PolicyEndpoint {
		if w := nodeWarnings(pe, node); len(w) > 0 {
			return withWarnings(pe, w...)
		}
		return pe
	},
}

// ParsePolicyEndpoints decodes and validates a PolicyEndpoint file: YAML or
// JSON, one or more documents, each a PolicyEndpoint, a ClusterPolicyEndpoint
// or a List of them (the ClusterPolicyEndpoints are left out: see
// ParseClusterPolicyEndpoints). An empty file holds no objects. Errors name
// the file, the document when there are several, the object, the field and
// the value; one error, of an object of either kind, fails the whole file
// (the source puts in force what parsePolicyFile recovers).
func ParsePolicyEndpoints(path string, data []byte) ([]*PolicyEndpoint, error) {
	return parseAll[*PolicyEndpoint](path, data)
}

// peValidator turns a decoded object into a PolicyEndpoint (pe).
type peValidator struct {
	validator
	pe *PolicyEndpoint
}

func (v *peValidator) row() *PolicyEndpoint { return v.pe }

// header checks apiVersion and kind and reads metadata.name/namespace.
func (v *peValidator) header(base *field.Path, obj *policyEndpointObject) {
	v.typeMeta(base, obj.APIVersion, obj.Kind, PolicyEndpointKind)
	v.pe.Name = v.objectName(base.Child("metadata", "name"), obj.Metadata.Name)
	v.pe.Namespace = v.objectName(base.Child("metadata", "namespace"), obj.Metadata.Namespace)
}

func (v *peValidator) spec(path *field.Path, obj *policyEndpointObject) {
	spec := obj.Spec
	if !v.present(path, spec != nil) {
		return
	}
	if ref := path.Child("policyRef"); v.present(ref, spec.PolicyRef != nil) {
		ns := v.pe.Namespace
		if spec.PolicyRef.Namespace != "" {
			ns = v.objectName(ref.Child("namespace"), spec.PolicyRef.Namespace)
			if ns != v.pe.Namespace {
				v.warn(ref.Child("namespace"), "%q is not the object's namespace %q: the object is a slice of %s/%s (the slices of a policy are in its namespace)",
					ns, v.pe.Namespace, v.pe.Namespace, spec.PolicyRef.Name)
			}
		}
		v.pe.PolicyRef = ns + "/" + v.objectName(ref.Child("name"), spec.PolicyRef.Name)
	}
	excepts := 0
	for _, r := range append(slices.Clip(spec.Ingress), spec.Egress...) {
		excepts += len(r.Except)
	}
	if !v.withinLimits(PolicyEndpointKind,
		limit{path.Child("podSelectorEndpoints"), "pod IPs", len(spec.PodSelectorEndpoints), MaxPolicyEndpointPods},
		limit{path, "rules (ingress and egress)", len(spec.Ingress) + len(spec.Egress), MaxPolicyEndpointRules},
		limit{path, "excepts (ingress and egress)", excepts, MaxPolicyEndpointExcepts}) {
		return
	}
	for i, t := range spec.PodIsolation {
		p := path.Child("podIsolation").Index(i)
		isolates := map[string]*bool{"Ingress": &v.pe.IsolatesIngress, "Egress": &v.pe.IsolatesEgress}[t]
		switch {
		case isolates == nil:
			v.fail(field.Invalid(p, t, "is not Ingress or Egress"))
			continue
		case *isolates:
			v.warn(p, "%s is listed twice", t)
		}
		*isolates = true
	}
	v.pe.Pods = v.pods(path.Child("podSelectorEndpoints"), spec.PodSelectorEndpoints)
	v.pe.Ingress, _ = v.rules(path.Child("ingress"), spec.Ingress, v.pe.IsolatesIngress, "Ingress")
	v.pe.Egress, v.pe.EgressNames = v.rules(path.Child("egress"), spec.Egress, v.pe.IsolatesEgress, "Egress")
}

// rules reads the rules of a direction; they have no effect unless the
// pods are isolated in it. An egress entry with a domainName and no cidr
// (a domainName peer of the controller: an ApplicationNetworkPolicy's
// domainNames) is a name rule, returned apart; one with neither allows
// nothing, with a warning: the AWS agent v1.5.0 skips both
// (controllers/policyendpoints_controller.go, the egress loop of
// deriveIngressAndEgressFirewallRules). domainName is egress only
// (api/v1alpha1/policyendpoints_types.go).
func (v *peValidator) rules(path *field.Path, in []endpointInfo, isolated bool, dir string) ([]Rule, []endpoints.NameRule) {
	var out []Rule
	var names []endpoints.NameRule
	for i, r := range in {
		p := path.Index(i)
		if r.CIDR == "" && dir == "Egress" {
			v.excepts(p.Child("except"), r.Except, netip.Prefix{})
			ports := v.ports(p.Child("ports"), r.Ports)
			if _, name := v.peer(p, dir, r.CIDR, r.DomainName, "allows nothing"); name != "" {
				names = append(names, endpoints.NameRule{Pattern: name, Ports: ports})
			}
			continue
		}
		if read, _ := v.peer(p, dir, r.CIDR, r.DomainName, "allows nothing"); !read {
			continue
		}
		cidr := v.prefix(p.Child("cidr"), r.CIDR)
		out = append(out, Rule{CIDR: cidr, Except: v.excepts(p.Child("except"), r.Except, cidr), Ports: v.ports(p.Child("ports"), r.Ports)})
	}
	if n := len(out) + len(names); n > 0 && !isolated {
		v.warn(path, "%d rules, but podIsolation does not list %s: they have no effect", n, dir)
	}
	return out, names
}

// excepts parses a rule's excepts and keeps those that can matter: of the
// cidr's family (the other family's are dropped, each with a warning: the
// AWS agent turned them into malformed keys) and overlapping the cidr.
func (v *peValidator) excepts(path *field.Path, in []string, cidr netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range in {
		p := path.Index(i)
		e := v.prefix(p, s)
		if !e.IsValid() || !cidr.IsValid() {
			continue
		}
		switch {
		case bpf.FamilyOf(e.Addr()) != bpf.FamilyOf(cidr.Addr()):
			v.warn(p, "%s is %s but the rule's cidr %s is %s: dropped", e, bpf.FamilyOf(e.Addr()), cidr, bpf.FamilyOf(cidr.Addr()))
			continue
		case !e.Overlaps(cidr):
			v.warn(p, "%s is outside the rule's cidr %s: dropped (it excludes nothing)", e, cidr)
			continue
		case e.Bits() <= cidr.Bits():
			v.warn(p, "%s covers the rule's whole cidr %s: the rule allows nothing", e, cidr)
		}
		if slices.Contains(out, e) {
			v.warn(p, "%s is listed twice", e)
			continue
		}
		out = append(out, e)
	}
	return out
}

// lenientPolicyEndpoint is what the stand-in of a PolicyEndpoint reads
// (recover.go), besides its pods:
//
//   - metadata.name and namespace, for the key; when they cannot be read,
//     the key is "FILE#DOCUMENT" (with ".items[I]" for an item of a list),
//     which no valid object has (a valid key holds a '/');
//   - spec.podIsolation: the directions listed; both when it is missing, is
//     not a list, or lists anything else;
//   - spec.policyRef, for the row.
//
// A document that is not YAML or JSON is read by its text only: its podIPs,
// both directions.
func lenientPolicyEndpoint(file, name, key string, meta, spec map[string]any) *PolicyEndpoint {
	pe := &PolicyEndpoint{File: file, Name: name}
	if ns, n := str(meta, "namespace"), str(meta, "name"); validName(ns) && validName(n) {
		pe.Namespace, pe.Name = ns, n
	}
	if ns, n, ok := strings.Cut(key, "/"); ok {
		pe.Namespace, pe.Name = ns, n
	}
	if ref, _ := spec["policyRef"].(map[string]any); str(ref, "name") != "" {
		ns := str(ref, "namespace")
		if ns == "" {
			ns = pe.Namespace
		}
		pe.PolicyRef = ns + "/" + str(ref, "name")
	}
	pe.IsolatesIngress, pe.IsolatesEgress = isolationOf(spec["podIsolation"])
	return pe
}

// isolationOf reads podIsolation: both directions unless it is a list of
// Ingress and Egress only.
func isolationOf(v any) (ingress, egress bool) {
	list, ok := v.([]any)
	if !ok {
		return true, true
	}
	for _, t := range list {
		switch t {
		case "Ingress":
			ingress = true
		case "Egress":
			egress = true
		default:
			return true, true
		}
	}
	return ingress, egress
}

// nodeWarnings names what of pe this node does not program: pod IPs and
// rules of a family it does not run.
func nodeWarnings(pe *PolicyEndpoint, node nodeconfig.Config) []string {
	var out []string
	for _, p := range pe.Pods {
		if !node.FamilyEnabled(p.PodIP) {
			out = append(out, fmt.Sprintf("spec.podSelectorEndpoints: podIP %s: %s: not programmed", p.PodIP, familyDisabled(p.PodIP)))
		}
	}
	for _, d := range []policybpf.Direction{policybpf.Ingress, policybpf.Egress} {
		for i, r := range pe.Rules(d) {
			if node.FamilyEnabled(r.CIDR.Addr()) {
				continue
			}
			w := fmt.Sprintf("spec.%s[%d]: cidr %s: %s: rule skipped", d, i, r.CIDR, familyDisabled(r.CIDR.Addr()))
			if n := len(r.Except); n > 0 {
				w += fmt.Sprintf(" with its %d excepts", n)
			}
			out = append(out, w)
		}
	}
	return out
}
