package source

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/errtext"
	"github.com/enimasq/enimasq/cells/strictdecode"
)

// The API group and kinds the parser accepts.
const (
	PolicyEndpointAPIVersion = "networking.k8s.aws/v1alpha1"
	PolicyEndpointKind       = "PolicyEndpoint"
	policyEndpointListKind   = "PolicyEndpointList"
	listKind                 = "List" // kubectl get -o yaml of several objects
)

// MaxPolicyEndpointFileSize bounds one PolicyEndpoint file.
const MaxPolicyEndpointFileSize = 8 << 20

// The limits of one PolicyEndpoint, so that one object cannot take the
// agent's time and memory without bound: compile time is linear in rules
// and excepts (about 2 ms per 1,000), memory in pods times keys per pod.
// Each admits 50,000 with room to spare.
const (
	// MaxPolicyEndpointPods bounds spec.podSelectorEndpoints.
	MaxPolicyEndpointPods = 65536
	// MaxPolicyEndpointRules bounds the rules of spec.ingress and
	// spec.egress together.
	MaxPolicyEndpointRules = 65536
	// MaxPolicyEndpointExcepts bounds the excepts of all rules together.
	MaxPolicyEndpointExcepts = 65536
)

// maxNameLength is Kubernetes' limit on object names.
const maxNameLength = 253

var protocols = map[string]uint32{"TCP": bpf.ProtocolTCP, "UDP": bpf.ProtocolUDP, "SCTP": bpf.ProtocolSCTP}

// ParsePolicyEndpoints decodes and validates a PolicyEndpoint file: YAML or
// JSON, one or more documents, each a PolicyEndpoint, a ClusterPolicyEndpoint
// or a List of them (the ClusterPolicyEndpoints are left out: see
// ParseClusterPolicyEndpoints). An empty file holds no objects. Errors name
// the file, the document when there are several, the object, the field and
// the value; one error, of an object of either kind, fails the whole file
// (the source puts in force what parsePolicyFile recovers).
func ParsePolicyEndpoints(path string, data []byte) ([]*PolicyEndpoint, error) {
	objs, err := parsePolicyFile(path, data)
	if err != nil {
		return nil, err
	}
	out := make([]*PolicyEndpoint, 0, len(objs))
	for _, o := range objs {
		if o.pe != nil {
			out = append(out, o.pe)
		}
	}
	return out, nil
}

// parsedObject is one object of a file as read, a PolicyEndpoint (pe) or a
// ClusterPolicyEndpoint (cpe): valid (err nil), or the stand-in made of it
// (recover.go, recover_cluster.go) and its error.
type parsedObject struct {
	pe  *PolicyEndpoint
	cpe *ClusterPolicyEndpoint
	err error
	// guessed: the object's kind cannot be read; its kind is guessed from
	// its text (guessKinds), and every last good object of the file, of
	// either kind, stays (resolve): it may be one of them.
	guessed bool
}

// kindKey is the object's kind and key, unique in a file.
func (o parsedObject) kindKey() (kind, key string) {
	if o.cpe != nil {
		return ClusterPolicyEndpointKind, o.cpe.Key()
	}
	return PolicyEndpointKind, o.pe.Key()
}

// parsePolicyFile parses a file object by object, in order: an object that
// is not valid is given as its stand-in, with its error; the error returned
// joins them. Only a file that is too large gives no objects. Each
// document's kind says what it is: a PolicyEndpoint, a
// ClusterPolicyEndpoint, or a list of them.
func parsePolicyFile(path string, data []byte) ([]parsedObject, error) {
	if len(data) > MaxPolicyEndpointFileSize {
		return nil, fmt.Errorf("%s: file is larger than %d bytes", path, MaxPolicyEndpointFileSize)
	}
	docs, err := strictdecode.Documents(data)
	if err != nil {
		err = fmt.Errorf("%s: %w", path, err)
		return guessedStandIns(path, standInName(path, 1, -1), data, err), err
	}
	var out []parsedObject
	var errs []error
	seen := map[[2]string]string{} // kind, key -> where
	for _, doc := range docs {
		where := path
		if len(docs) > 1 {
			where = fmt.Sprintf("%s: document %d", path, doc.Index)
		}
		for _, o := range parseDocument(path, doc.Index, where, doc.Data) {
			if o.err == nil {
				kind, key := o.kindKey()
				if first, dup := seen[[2]string{kind, key}]; dup {
					o.err = fmt.Errorf("%s: %s %s is defined twice (first in %s)", where, kind, key, first)
				} else {
					seen[[2]string{kind, key}] = where
				}
			}
			if o.err != nil {
				errs = append(errs, o.err)
			}
			out = append(out, o)
		}
	}
	return out, errors.Join(errs...)
}

// The kinds of a document, as the parser names them in an error.
const (
	documentKinds = PolicyEndpointKind + ", " + ClusterPolicyEndpointKind + ", " + policyEndpointListKind + ", " +
		clusterPolicyEndpointListKind + " or " + listKind
	itemKinds = PolicyEndpointKind + " or " + ClusterPolicyEndpointKind
)

// parseDocument parses document n of file (at where): a PolicyEndpoint, a
// ClusterPolicyEndpoint, or a list of them.
func parseDocument(file string, n int, where string, doc []byte) []parsedObject {
	js, err := strictdecode.ToJSON(doc)
	if err != nil {
		err = fmt.Errorf("%s: not valid YAML or JSON: %w", where, err)
		return guessedStandIns(file, standInName(file, n, -1), doc, err)
	}
	if bytes.Equal(js, []byte("null")) {
		return nil // blank or comments only
	}
	fail := func(err error) []parsedObject {
		err = fmt.Errorf("%s: %w", where, err)
		return guessedStandIns(file, standInName(file, n, -1), js, err)
	}
	if !bytes.HasPrefix(js, []byte("{")) {
		return fail(fmt.Errorf("want a PolicyEndpoint, a ClusterPolicyEndpoint or a List, got %s", errtext.Value(js)))
	}
	wrap := func(err error) error { return fmt.Errorf("%s: %w", where, err) }
	kind := kindOf(js)
	switch kind {
	case PolicyEndpointKind, ClusterPolicyEndpointKind:
		return []parsedObject{parseItem(file, nil, kind, js, wrap, standInName(file, n, -1))}
	case listKind, policyEndpointListKind, clusterPolicyEndpointListKind:
		var list policyEndpointList
		if errs := policyDecoder.Fields(nil, js, &list); len(errs) > 0 {
			return fail(strictdecode.Format(errs))
		}
		out := make([]parsedObject, 0, len(list.Items))
		for i, item := range list.Items {
			var itemKind any = map[any]string{policyEndpointListKind: PolicyEndpointKind, clusterPolicyEndpointListKind: ClusterPolicyEndpointKind}[kind]
			if itemKind == "" {
				itemKind = kindOf(item)
			}
			out = append(out, parseItem(file, field.NewPath("items").Index(i), itemKind, item, wrap, standInName(file, n, i)))
		}
		return out
	}
	if kind == nil || kind == "" {
		return fail(strictdecode.Format(field.ErrorList{field.Required(field.NewPath("kind"), "want "+documentKinds)}))
	}
	return fail(strictdecode.Format(field.ErrorList{field.Invalid(field.NewPath("kind"), kind, "is not "+documentKinds)}))
}

// kindOf is the kind of an object (its JSON), as decoded: nil when it has
// none or is not an object.
func kindOf(js []byte) any {
	var head struct {
		Kind any `json:"kind"`
	}
	_ = json.Unmarshal(js, &head) // an object: the kind is checked by the caller
	return head.Kind
}

// parseItem parses an object at base (the top level of a document, or
// items[i] of a list) as kind says: a PolicyEndpoint, a
// ClusterPolicyEndpoint, or, for any other kind, what its text suggests
// (guessKinds), which then reports the kind; an error is wrapped by wrap.
// An object that is not valid gives its stand-in, named name when its own
// name cannot be read.
func parseItem(file string, base *field.Path, kind any, js []byte, wrap func(error) error, name string) parsedObject {
	guessed := false
	if kind != PolicyEndpointKind && kind != ClusterPolicyEndpointKind {
		guessed = true
		if pe, _ := guessKinds(js); pe {
			kind = PolicyEndpointKind
		} else {
			kind = ClusterPolicyEndpointKind
		}
	}
	if kind == ClusterPolicyEndpointKind {
		cpe, err := parseClusterObject(file, base, js)
		if err != nil {
			err = wrap(err)
			return parsedObject{cpe: recoverClusterJSON(file, name, "", js, err), err: err, guessed: guessed}
		}
		return parsedObject{cpe: cpe, guessed: guessed}
	}
	pe, err := parseObject(file, base, js)
	if err != nil {
		err = wrap(err)
		return parsedObject{pe: recoverJSON(file, name, "", js, err), err: err, guessed: guessed}
	}
	return parsedObject{pe: pe, guessed: guessed}
}

// parseObject decodes and validates one PolicyEndpoint object at base (the
// top level, or items[i] of a list). Errors past the header (apiVersion,
// kind, metadata) name the object.
func parseObject(file string, base *field.Path, js []byte) (*PolicyEndpoint, error) {
	var obj policyEndpointObject
	unknown, errs := decodeObject(base, js, &obj)
	v := &validator{pe: &PolicyEndpoint{File: file}}
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
		return nil, fmt.Errorf("%s: %w", v.pe.Key(), strictdecode.Format(errs))
	}
	v.pe.Warnings, v.pe.Unknown = v.warnings, unknown
	return v.pe, nil
}

// decodeObject decodes an object of either kind at base into obj, as a
// Kubernetes client does: a field its type does not have (a newer
// controller's, as spec.subject of v1.1.10's ClusterPolicyEndpoints) is
// not an error but returned by its path, for the source to name; a field
// given twice or a value of the wrong type is an error.
func decodeObject(base *field.Path, js []byte, obj any) (unknown []string, errs field.ErrorList) {
	return strictdecode.SplitUnknown(policyDecoder.Fields(base, js, obj))
}

// validator turns a decoded object into a PolicyEndpoint (pe), collecting
// errors and warnings. Its field checks (addresses, prefixes, ports, pods)
// are also those of a ClusterPolicyEndpoint (clusterValidator).
type validator struct {
	pe       *PolicyEndpoint
	errs     field.ErrorList
	warnings []string
}

func (v *validator) fail(e *field.Error) { v.errs = append(v.errs, e) }

// required reports whether a required field is set, failing if not.
func (v *validator) required(path *field.Path, s string) bool {
	if s == "" {
		v.fail(field.Required(path, ""))
	}
	return s != ""
}

func (v *validator) warn(path *field.Path, format string, args ...any) {
	v.warnings = append(v.warnings, path.String()+": "+fmt.Sprintf(format, args...))
}

// header checks apiVersion and kind and reads metadata.name/namespace.
func (v *validator) header(base *field.Path, obj *policyEndpointObject) {
	if obj.APIVersion != PolicyEndpointAPIVersion {
		v.fail(field.Invalid(base.Child("apiVersion"), obj.APIVersion, "is not "+PolicyEndpointAPIVersion))
	}
	if obj.Kind != PolicyEndpointKind {
		v.fail(field.Invalid(base.Child("kind"), obj.Kind, "is not "+PolicyEndpointKind))
	}
	v.pe.Name = v.objectName(base.Child("metadata", "name"), obj.Metadata.Name)
	v.pe.Namespace = v.objectName(base.Child("metadata", "namespace"), obj.Metadata.Namespace)
}

// objectName checks a Kubernetes object name: non-empty, at most 253
// characters, no '/' and no blanks.
func (v *validator) objectName(path *field.Path, s string) string {
	if v.required(path, s) && (len(s) > maxNameLength || strings.ContainsAny(s, "/ \t\r\n")) {
		v.fail(field.Invalid(path, s, fmt.Sprintf("is not an object name (1-%d characters, no '/' or blanks)", maxNameLength)))
	}
	return s
}

func (v *validator) spec(path *field.Path, spec *policyEndpointSpec) {
	if spec == nil {
		v.fail(field.Required(path, ""))
		return
	}
	if ref := path.Child("policyRef"); spec.PolicyRef == nil {
		v.fail(field.Required(ref, ""))
	} else {
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
	if !v.withinLimits(path, spec) {
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
	v.pe.Ingress = v.rules(path.Child("ingress"), spec.Ingress, v.pe.IsolatesIngress, "Ingress")
	v.pe.Egress = v.rules(path.Child("egress"), spec.Egress, v.pe.IsolatesEgress, "Egress")
}

// withinLimits checks the object's size against the limits of one
// PolicyEndpoint, before anything is parsed.
func (v *validator) withinLimits(path *field.Path, spec *policyEndpointSpec) bool {
	excepts := 0
	for _, r := range append(slices.Clip(spec.Ingress), spec.Egress...) {
		excepts += len(r.Except)
	}
	for _, c := range []struct {
		path   *field.Path
		what   string
		n, max int
	}{
		{path.Child("podSelectorEndpoints"), "pod IPs", len(spec.PodSelectorEndpoints), MaxPolicyEndpointPods},
		{path, "rules (ingress and egress)", len(spec.Ingress) + len(spec.Egress), MaxPolicyEndpointRules},
		{path, "excepts (ingress and egress)", excepts, MaxPolicyEndpointExcepts},
	} {
		if c.n > c.max {
			v.fail(field.TooMany(c.path, c.n, c.max))
			v.errs[len(v.errs)-1].Detail = fmt.Sprintf("%d %s, a PolicyEndpoint may have at most %d: split the policy", c.n, c.what, c.max)
		}
	}
	return len(v.errs) == 0
}

// pods reads podSelectorEndpoints: one entry per pod IP, the first of each.
func (v *validator) pods(path *field.Path, pods []podEndpoint) []PodEndpoint {
	var out []PodEndpoint
	seen := map[netip.Addr]int{}
	for i, pod := range pods {
		p := path.Index(i)
		ep := PodEndpoint{Name: pod.Name, Namespace: pod.Namespace}
		if ep.PodIP = v.address(p.Child("podIP"), pod.PodIP); !ep.PodIP.IsValid() {
			continue
		}
		if pod.HostIP == "" {
			v.warn(p, "no hostIP: the node IP is not added for pod IP %s", ep.PodIP)
		} else if ep.HostIP = v.address(p.Child("hostIP"), pod.HostIP); ep.HostIP.IsValid() && bpf.FamilyOf(ep.HostIP) != bpf.FamilyOf(ep.PodIP) {
			v.warn(p, "hostIP %s is not of the family of podIP %s: the node IP is not added for this pod IP", ep.HostIP, ep.PodIP)
			ep.HostIP = netip.Addr{}
		}
		if j, dup := seen[ep.PodIP]; dup {
			v.warn(p, "podIP %s is listed twice (also %s): the first is used", ep.PodIP, path.Index(j))
			continue
		}
		seen[ep.PodIP] = i
		out = append(out, ep)
	}
	return out
}

// address parses a pod or host IP: an IPv4 or IPv6 address, not
// IPv4-mapped, without a zone. It is invalid after an error.
func (v *validator) address(path *field.Path, s string) netip.Addr {
	if !v.required(path, s) {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	switch {
	case err != nil:
		v.fail(field.Invalid(path, s, "is not an IP address"))
	case a.Is4In6():
		v.fail(field.Invalid(path, s, "is an IPv4-mapped IPv6 address: write it as IPv4"))
	case a.Zone() != "":
		v.fail(field.Invalid(path, s, "has a zone"))
	default:
		return a
	}
	return netip.Addr{}
}

// prefix parses a cidr or except: a CIDR, or an address meaning its host
// prefix (the controller writes pod IPs that way). Host bits are cleared
// with a warning. It is invalid after an error.
func (v *validator) prefix(path *field.Path, s string) netip.Prefix {
	if !v.required(path, s) {
		return netip.Prefix{}
	}
	s = strings.TrimSpace(s)
	var a netip.Addr
	pfx, err := netip.ParsePrefix(s)
	if !strings.Contains(s, "/") {
		if a, err = netip.ParseAddr(s); err == nil {
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
	}
	switch {
	case err != nil:
		v.fail(field.Invalid(path, s, "is not a CIDR"))
	case a.Zone() != "":
		v.fail(field.Invalid(path, s, "has a zone"))
	case pfx.Addr().Is4In6():
		v.fail(field.Invalid(path, s, "is an IPv4-mapped IPv6 prefix: write it as IPv4"))
	default:
		if m := pfx.Masked(); m != pfx {
			v.warn(path, "%q has host bits set: using %s", s, m)
			pfx = m
		}
		return pfx
	}
	return netip.Prefix{}
}

// rules reads the rules of a direction; they have no effect unless the
// pods are isolated in it. An egress entry without a cidr (a domainName
// peer of the controller v1.5.0) allows nothing, with a warning: the AWS
// agent v1.5.0 skips it (controllers/policyendpoints_controller.go, the
// egress loop of deriveIngressAndEgressFirewallRules). domainName is
// egress only (api/v1alpha1/policyendpoints_types.go).
func (v *validator) rules(path *field.Path, in []endpointInfo, isolated bool, dir string) []Rule {
	var out []Rule
	for i, r := range in {
		p := path.Index(i)
		switch {
		case r.DomainName != "" && dir == "Ingress":
			v.fail(field.Invalid(p.Child("domainName"), r.DomainName, "is for egress rules only"))
			continue
		case r.CIDR == "" && dir == "Egress":
			v.excepts(p.Child("except"), r.Except, netip.Prefix{})
			v.ports(p.Child("ports"), r.Ports)
			if r.DomainName != "" {
				v.warn(p, "domainName %q without a cidr: allows nothing (domain names are not enforced; the AWS agent skips the entry)", r.DomainName)
			} else {
				v.warn(p, "no cidr: allows nothing (the AWS agent skips the entry)")
			}
			continue
		case r.DomainName != "":
			v.warn(p.Child("domainName"), "%q is not enforced: the entry's cidr %s is", r.DomainName, r.CIDR)
		}
		cidr := v.prefix(p.Child("cidr"), r.CIDR)
		out = append(out, Rule{CIDR: cidr, Except: v.excepts(p.Child("except"), r.Except, cidr), Ports: v.ports(p.Child("ports"), r.Ports)})
	}
	if len(out) > 0 && !isolated {
		v.warn(path, "%d rules, but podIsolation does not list %s: they have no effect", len(out), dir)
	}
	return out
}

// excepts parses a rule's excepts and keeps those that can matter: of the
// cidr's family (the other family's are dropped, each with a warning: the
// AWS agent turned them into malformed keys) and overlapping the cidr.
func (v *validator) excepts(path *field.Path, in []string, cidr netip.Prefix) []netip.Prefix {
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

func (v *validator) ports(path *field.Path, in []portInfo) []Port {
	var out []Port
	for i, pi := range in {
		p := path.Index(i)
		port := Port{Protocol: bpf.ProtocolTCP} // as in Kubernetes
		if pi.Protocol != nil {
			var ok bool
			if port.Protocol, ok = protocols[*pi.Protocol]; !ok {
				v.fail(field.Invalid(p.Child("protocol"), *pi.Protocol, "is not TCP, UDP or SCTP"))
			}
		}
		if pi.Port != nil {
			port.Port = v.portNumber(p.Child("port"), *pi.Port)
		}
		if pi.EndPort != nil {
			end := v.portNumber(p.Child("endPort"), *pi.EndPort)
			switch {
			case end == 0 || (pi.Port != nil && port.Port == 0): // reported
			case pi.Port == nil:
				v.fail(field.Invalid(p.Child("endPort"), end, "needs a port"))
			case end < port.Port:
				v.fail(field.Invalid(p.Child("endPort"), end, fmt.Sprintf("is below port %d", port.Port)))
			case end > port.Port:
				port.EndPort = end
			}
		}
		out = append(out, port)
	}
	return out
}

func (v *validator) portNumber(path *field.Path, n int64) uint16 {
	if n < 1 || n > 65535 {
		v.fail(field.Invalid(path, n, "is outside 1..65535"))
		return 0
	}
	return uint16(n)
}

// policyDecoder decodes PolicyEndpoints strictly; the errors of a value of
// the wrong type say what these fields hold.
var policyDecoder = strictdecode.Decoder{Holds: map[string]string{
	"podIsolation": "a list of policy types (Ingress, Egress)",
	"except":       "a list of CIDRs",
}}
