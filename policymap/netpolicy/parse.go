package netpolicy

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/enimasq/enimasq/bpf"
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

// maxNameLength is Kubernetes' limit on object names.
const maxNameLength = 253

// Known fields, for the unknown-field errors.
var (
	topFields      = []string{"apiVersion", "kind", "metadata", "spec", "status"}
	listFields     = []string{"apiVersion", "kind", "metadata", "items"}
	metadataFields = []string{"name", "namespace", "generateName", "uid", "resourceVersion", "generation",
		"creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
		"ownerReferences", "finalizers", "managedFields", "selfLink"}
	specFields     = []string{"policyRef", "podIsolation", "podSelector", "podSelectorEndpoints", "ingress", "egress"}
	policyRefField = []string{"name", "namespace"}
	selectorFields = []string{"matchLabels", "matchExpressions"}
	exprFields     = []string{"key", "operator", "values"}
	podFields      = []string{"hostIP", "podIP", "name", "namespace"}
	ruleFields     = []string{"cidr", "except", "ports"}
	portFields     = []string{"protocol", "port", "endPort"}
)

// ParsePolicyEndpoints decodes and validates a PolicyEndpoint file: YAML or
// JSON, one or more documents, each a PolicyEndpoint or a List of them. An
// empty file holds no objects. Errors name the file, the document when
// there are several, the object, the field and the value; one error fails
// the whole file.
func ParsePolicyEndpoints(path string, data []byte) ([]*PolicyEndpoint, error) {
	if len(data) > MaxPolicyEndpointFileSize {
		return nil, fmt.Errorf("%s: file is larger than %d bytes", path, MaxPolicyEndpointFileSize)
	}
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []*PolicyEndpoint
	seen := map[string]string{} // key -> where
	for i, doc := range docs {
		where := path
		if len(docs) > 1 {
			where = fmt.Sprintf("%s: document %d", path, i+1)
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: not valid YAML or JSON: %w", where, err)
		}
		if isNull(js) {
			continue // blank or comments only
		}
		pes, err := parseDocument(path, where, js)
		if err != nil {
			return nil, err
		}
		for _, pe := range pes {
			if first, dup := seen[pe.Key()]; dup {
				return nil, fmt.Errorf("%s: PolicyEndpoint %s is defined twice (first in %s)", where, pe.Key(), first)
			}
			seen[pe.Key()] = where
			out = append(out, pe)
		}
	}
	return out, nil
}

// parseDocument parses one document: a PolicyEndpoint or a list of them.
func parseDocument(file, where string, js []byte) ([]*PolicyEndpoint, error) {
	var head struct {
		Kind json.RawMessage `json:"kind"`
	}
	if err := json.Unmarshal(js, &head); err != nil {
		return nil, fmt.Errorf("%s: want a PolicyEndpoint or a List, got %s", where, quoteValue(js))
	}
	kind, err := str("kind", orNull(head.Kind))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	switch kind {
	case PolicyEndpointKind:
		pe, err := parseObject(file, "", js)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		return []*PolicyEndpoint{pe}, nil
	case listKind, policyEndpointListKind:
		fields, err := object("", js, listFields...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		var items []json.RawMessage
		if raw, ok := fields["items"]; ok {
			items, err = list("items", raw, "PolicyEndpoint objects")
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		out := make([]*PolicyEndpoint, 0, len(items))
		for i, item := range items {
			pe, err := parseObject(file, at("items", i), item)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			out = append(out, pe)
		}
		return out, nil
	case "":
		return nil, fmt.Errorf("%s: field kind is missing: want %s, %s or %s", where, PolicyEndpointKind, policyEndpointListKind, listKind)
	default:
		return nil, fmt.Errorf("%s: field kind: value %q is not %s, %s or %s", where, kind, PolicyEndpointKind, policyEndpointListKind, listKind)
	}
}

func orNull(raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return json.RawMessage(`""`)
	}
	return raw
}

// parseObject parses one PolicyEndpoint object at path (the top level, or
// items[i] of a list).
func parseObject(file, path string, raw json.RawMessage) (*PolicyEndpoint, error) {
	fields, err := object(path, raw, topFields...)
	if err != nil {
		return nil, err
	}
	p := &objectParser{pe: &PolicyEndpoint{File: file}}
	if err := p.header(path, fields); err != nil {
		return nil, err
	}
	spec, ok := fields["spec"]
	if !ok {
		return nil, fmt.Errorf("%s: %s is missing", p.pe.Key(), fieldName(join(path, "spec")))
	}
	if err := p.spec(join(path, "spec"), spec); err != nil {
		return nil, fmt.Errorf("%s: %w", p.pe.Key(), err)
	}
	return p.pe, nil
}

type objectParser struct {
	pe *PolicyEndpoint
}

func (p *objectParser) warn(format string, args ...any) {
	p.pe.Warnings = append(p.pe.Warnings, fmt.Sprintf(format, args...))
}

// header checks apiVersion and kind and reads metadata.name/namespace.
func (p *objectParser) header(path string, fields map[string]json.RawMessage) error {
	apiVersion, err := str(join(path, "apiVersion"), orNull(fields["apiVersion"]))
	if err != nil {
		return err
	}
	if apiVersion != PolicyEndpointAPIVersion {
		return fmt.Errorf("%s: value %q is not %s", fieldName(join(path, "apiVersion")), apiVersion, PolicyEndpointAPIVersion)
	}
	kind, err := str(join(path, "kind"), orNull(fields["kind"]))
	if err != nil {
		return err
	}
	if kind != PolicyEndpointKind {
		return fmt.Errorf("%s: value %q is not %s", fieldName(join(path, "kind")), kind, PolicyEndpointKind)
	}
	metaPath := join(path, "metadata")
	meta, err := object(metaPath, orEmptyObject(fields["metadata"]), metadataFields...)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"name", &p.pe.Name}, {"namespace", &p.pe.Namespace}} {
		fp := join(metaPath, f.name)
		raw, ok := meta[f.name]
		if !ok {
			return fmt.Errorf("%s is missing", fieldName(fp))
		}
		if *f.dst, err = objectName(fp, raw); err != nil {
			return err
		}
	}
	return nil
}

func orEmptyObject(raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return json.RawMessage(`{}`)
	}
	return raw
}

// objectName reads a Kubernetes object name: non-empty, at most 253
// characters, no '/' and no blanks.
func objectName(path string, raw json.RawMessage) (string, error) {
	s, err := str(path, raw)
	if err != nil {
		return "", err
	}
	if s == "" || len(s) > maxNameLength || strings.ContainsAny(s, "/ \t\r\n") {
		return "", fmt.Errorf("%s: value %q is not an object name (1-%d characters, no '/' or blanks)", fieldName(path), s, maxNameLength)
	}
	return s, nil
}

func (p *objectParser) spec(path string, raw json.RawMessage) error {
	fields, err := object(path, raw, specFields...)
	if err != nil {
		return err
	}
	if err := p.policyRef(join(path, "policyRef"), fields["policyRef"]); err != nil {
		return err
	}
	if raw, ok := fields["podIsolation"]; ok {
		if err := p.podIsolation(join(path, "podIsolation"), raw); err != nil {
			return err
		}
	}
	if raw, ok := fields["podSelector"]; ok {
		if err := labelSelector(join(path, "podSelector"), raw); err != nil {
			return err
		}
	}
	if raw, ok := fields["podSelectorEndpoints"]; ok {
		if err := p.pods(join(path, "podSelectorEndpoints"), raw); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		name  string
		dst   *[]Rule
		isolv bool
		dir   string
	}{{"ingress", &p.pe.Ingress, p.pe.IsolatesIngress, "Ingress"}, {"egress", &p.pe.Egress, p.pe.IsolatesEgress, "Egress"}} {
		raw, ok := fields[d.name]
		if !ok {
			continue
		}
		rules, err := p.rules(join(path, d.name), raw)
		if err != nil {
			return err
		}
		*d.dst = rules
		if len(rules) > 0 && !d.isolv {
			p.warn("%s: %d rules, but podIsolation does not list %s: they have no effect", join(path, d.name), len(rules), d.dir)
		}
	}
	return nil
}

func (p *objectParser) policyRef(path string, raw json.RawMessage) error {
	if raw == nil {
		return fmt.Errorf("%s is missing", fieldName(path))
	}
	fields, err := object(path, raw, policyRefField...)
	if err != nil {
		return err
	}
	nameRaw, ok := fields["name"]
	if !ok {
		return fmt.Errorf("%s is missing", fieldName(join(path, "name")))
	}
	name, err := objectName(join(path, "name"), nameRaw)
	if err != nil {
		return err
	}
	ns := p.pe.Namespace
	if raw, ok := fields["namespace"]; ok {
		if ns, err = objectName(join(path, "namespace"), raw); err != nil {
			return err
		}
	}
	p.pe.PolicyRef = ns + "/" + name
	return nil
}

func (p *objectParser) podIsolation(path string, raw json.RawMessage) error {
	items, err := list(path, raw, "policy types (Ingress, Egress)")
	if err != nil {
		return err
	}
	for i, item := range items {
		s, err := str(at(path, i), item)
		if err != nil {
			return err
		}
		var dst *bool
		switch s {
		case "Ingress":
			dst = &p.pe.IsolatesIngress
		case "Egress":
			dst = &p.pe.IsolatesEgress
		default:
			return fmt.Errorf("%s: value %q is not Ingress or Egress", fieldName(at(path, i)), s)
		}
		if *dst {
			p.warn("%s: %s is listed twice", at(path, i), s)
		}
		*dst = true
	}
	return nil
}

// labelSelector checks the shape of a Kubernetes label selector. The
// controller resolved it into podSelectorEndpoints: it is not used.
func labelSelector(path string, raw json.RawMessage) error {
	fields, err := object(path, raw, selectorFields...)
	if err != nil {
		return err
	}
	if raw, ok := fields["matchLabels"]; ok {
		var labels map[string]string
		if err := json.Unmarshal(raw, &labels); err != nil {
			return fmt.Errorf("%s: value %s is not a mapping of strings", fieldName(join(path, "matchLabels")), quoteValue(raw))
		}
	}
	if raw, ok := fields["matchExpressions"]; ok {
		exprs, err := list(join(path, "matchExpressions"), raw, "label selector requirements")
		if err != nil {
			return err
		}
		for i, e := range exprs {
			ep := at(join(path, "matchExpressions"), i)
			ef, err := object(ep, e, exprFields...)
			if err != nil {
				return err
			}
			for _, name := range []string{"key", "operator"} {
				if _, err := str(join(ep, name), orNull(ef[name])); err != nil {
					return err
				}
			}
			if raw, ok := ef["values"]; ok {
				var values []string
				if err := json.Unmarshal(raw, &values); err != nil {
					return fmt.Errorf("%s: value %s is not a list of strings", fieldName(join(ep, "values")), quoteValue(raw))
				}
			}
		}
	}
	return nil
}

func (p *objectParser) pods(path string, raw json.RawMessage) error {
	items, err := list(path, raw, "pod endpoints")
	if err != nil {
		return err
	}
	seen := map[netip.Addr]int{}
	for i, item := range items {
		ip := at(path, i)
		fields, err := object(ip, item, podFields...)
		if err != nil {
			return err
		}
		var pod PodEndpoint
		rawIP, ok := fields["podIP"]
		if !ok {
			return fmt.Errorf("%s is missing", fieldName(join(ip, "podIP")))
		}
		if pod.PodIP, err = address(join(ip, "podIP"), rawIP); err != nil {
			return err
		}
		if raw, ok := fields["hostIP"]; ok {
			if pod.HostIP, err = address(join(ip, "hostIP"), raw); err != nil {
				return err
			}
			if bpf.FamilyOf(pod.HostIP) != bpf.FamilyOf(pod.PodIP) {
				p.warn("%s: hostIP %s is not of the family of podIP %s: the node IP is not added for this pod IP", ip, pod.HostIP, pod.PodIP)
				pod.HostIP = netip.Addr{}
			}
		} else {
			p.warn("%s: no hostIP: the node IP is not added for pod IP %s", ip, pod.PodIP)
		}
		for _, f := range []struct {
			name string
			dst  *string
		}{{"name", &pod.Name}, {"namespace", &pod.Namespace}} {
			if raw, ok := fields[f.name]; ok {
				if *f.dst, err = str(join(ip, f.name), raw); err != nil {
					return err
				}
			}
		}
		if j, dup := seen[pod.PodIP]; dup {
			p.warn("%s: podIP %s is listed twice (also %s): the first is used", ip, pod.PodIP, at(path, j))
			continue
		}
		seen[pod.PodIP] = i
		p.pe.Pods = append(p.pe.Pods, pod)
	}
	return nil
}

// address parses a pod or host IP: an IPv4 or IPv6 address, not
// IPv4-mapped, without a zone.
func address(path string, raw json.RawMessage) (netip.Addr, error) {
	s, err := str(path, raw)
	if err != nil {
		return netip.Addr{}, err
	}
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s: value %q is not an IP address", fieldName(path), s)
	}
	if a.Is4In6() {
		return netip.Addr{}, fmt.Errorf("%s: value %q is an IPv4-mapped IPv6 address: write it as IPv4", fieldName(path), s)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s: value %q has a zone", fieldName(path), s)
	}
	return a, nil
}

// prefix parses a cidr or except: a CIDR, or an address meaning its host
// prefix (the controller writes pod IPs that way). Host bits are cleared
// with a warning.
func (p *objectParser) prefix(path string, raw json.RawMessage) (netip.Prefix, error) {
	s, err := str(path, raw)
	if err != nil {
		return netip.Prefix{}, err
	}
	s = strings.TrimSpace(s)
	var pfx netip.Prefix
	if strings.Contains(s, "/") {
		pfx, err = netip.ParsePrefix(s)
	} else {
		var a netip.Addr
		if a, err = netip.ParseAddr(s); err == nil {
			if a.Zone() != "" {
				return netip.Prefix{}, fmt.Errorf("%s: value %q has a zone", fieldName(path), s)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s: value %q is not a CIDR", fieldName(path), s)
	}
	if pfx.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%s: value %q is an IPv4-mapped IPv6 prefix: write it as IPv4", fieldName(path), s)
	}
	if m := pfx.Masked(); m != pfx {
		p.warn("%s: %q has host bits set: using %s", path, s, m)
		pfx = m
	}
	return pfx, nil
}

func (p *objectParser) rules(path string, raw json.RawMessage) ([]Rule, error) {
	items, err := list(path, raw, "rules")
	if err != nil {
		return nil, err
	}
	rules := make([]Rule, 0, len(items))
	for i, item := range items {
		r, err := p.rule(at(path, i), item)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

func (p *objectParser) rule(path string, raw json.RawMessage) (Rule, error) {
	fields, err := object(path, raw, ruleFields...)
	if err != nil {
		return Rule{}, err
	}
	var r Rule
	rawCIDR, ok := fields["cidr"]
	if !ok {
		return Rule{}, fmt.Errorf("%s is missing", fieldName(join(path, "cidr")))
	}
	if r.CIDR, err = p.prefix(join(path, "cidr"), rawCIDR); err != nil {
		return Rule{}, err
	}
	if raw, ok := fields["except"]; ok {
		if r.Except, err = p.excepts(join(path, "except"), raw, r.CIDR); err != nil {
			return Rule{}, err
		}
	}
	if raw, ok := fields["ports"]; ok {
		if r.Ports, err = ports(join(path, "ports"), raw); err != nil {
			return Rule{}, err
		}
	}
	return r, nil
}

// excepts parses a rule's excepts and keeps those that can matter: of the
// cidr's family (the other family's are dropped, each with a warning: the
// AWS agent turned them into malformed keys) and overlapping the cidr.
func (p *objectParser) excepts(path string, raw json.RawMessage, cidr netip.Prefix) ([]netip.Prefix, error) {
	items, err := list(path, raw, "CIDRs")
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for i, item := range items {
		ep := at(path, i)
		e, err := p.prefix(ep, item)
		if err != nil {
			return nil, err
		}
		switch {
		case bpf.FamilyOf(e.Addr()) != bpf.FamilyOf(cidr.Addr()):
			p.warn("%s: %s is %s but the rule's cidr %s is %s: dropped", ep, e, bpf.FamilyOf(e.Addr()), cidr, bpf.FamilyOf(cidr.Addr()))
			continue
		case !e.Overlaps(cidr):
			p.warn("%s: %s is outside the rule's cidr %s: dropped (it excludes nothing)", ep, e, cidr)
			continue
		case e.Bits() <= cidr.Bits():
			p.warn("%s: %s covers the rule's whole cidr %s: the rule allows nothing", ep, e, cidr)
		}
		if containsPrefix(out, e) {
			p.warn("%s: %s is listed twice", ep, e)
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

func containsPrefix(ps []netip.Prefix, p netip.Prefix) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

func ports(path string, raw json.RawMessage) ([]Port, error) {
	items, err := list(path, raw, "ports")
	if err != nil {
		return nil, err
	}
	out := make([]Port, 0, len(items))
	for i, item := range items {
		pp := at(path, i)
		fields, err := object(pp, item, portFields...)
		if err != nil {
			return nil, err
		}
		port := Port{Protocol: bpf.ProtocolTCP} // as in Kubernetes
		if raw, ok := fields["protocol"]; ok {
			s, err := str(join(pp, "protocol"), raw)
			if err != nil {
				return nil, err
			}
			switch s {
			case "TCP":
				port.Protocol = bpf.ProtocolTCP
			case "UDP":
				port.Protocol = bpf.ProtocolUDP
			case "SCTP":
				port.Protocol = bpf.ProtocolSCTP
			default:
				return nil, fmt.Errorf("%s: value %q is not TCP, UDP or SCTP", fieldName(join(pp, "protocol")), s)
			}
		}
		if raw, ok := fields["port"]; ok {
			n, err := integer(join(pp, "port"), raw, 1, 65535)
			if err != nil {
				return nil, err
			}
			port.Port = uint16(n)
		}
		if raw, ok := fields["endPort"]; ok {
			n, err := integer(join(pp, "endPort"), raw, 1, 65535)
			if err != nil {
				return nil, err
			}
			switch {
			case port.Port == 0:
				return nil, fmt.Errorf("%s: value %d needs a port", fieldName(join(pp, "endPort")), n)
			case uint16(n) < port.Port:
				return nil, fmt.Errorf("%s: value %d is below port %d", fieldName(join(pp, "endPort")), n, port.Port)
			case uint16(n) > port.Port:
				port.EndPort = uint16(n)
			}
		}
		out = append(out, port)
	}
	return out, nil
}
