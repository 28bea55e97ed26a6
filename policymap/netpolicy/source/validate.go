package source

import (
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The limits of one object, so that one object cannot take the agent's
// time and memory without bound: compile time is linear in rules and
// excepts (about 2 ms per 1,000), memory in pods times keys per pod. Each
// admits 50,000 with room to spare.
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

var protocols = map[string]uint32{"TCP": policybpf.ProtocolTCP, "UDP": policybpf.ProtocolUDP, "SCTP": policybpf.ProtocolSCTP}

// validator collects the errors and warnings of one object; its field
// checks (header, names, limits, addresses, prefixes, ports, pods) are
// every kind's. A kind's validator embeds it (kind_pe.go, kind_cpe.go).
type validator struct {
	errs     field.ErrorList
	warnings []string
}

func (v *validator) common() *validator { return v }

func (v *validator) fail(e *field.Error) { v.errs = append(v.errs, e) }

// present reports whether a required object is there, failing if not.
func (v *validator) present(path *field.Path, ok bool) bool {
	if !ok {
		v.fail(field.Required(path, ""))
	}
	return ok
}

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

// typeMeta checks apiVersion and kind.
func (v *validator) typeMeta(base *field.Path, apiVersion, kind, want string) {
	if apiVersion != PolicyEndpointAPIVersion {
		v.fail(field.Invalid(base.Child("apiVersion"), apiVersion, "is not "+PolicyEndpointAPIVersion))
	}
	if kind != want {
		v.fail(field.Invalid(base.Child("kind"), kind, "is not "+want))
	}
}

// objectName checks a Kubernetes object name: non-empty, at most 253
// characters, no '/' and no blanks.
func (v *validator) objectName(path *field.Path, s string) string {
	if v.required(path, s) && (len(s) > maxNameLength || strings.ContainsAny(s, "/ \t\r\n")) {
		v.fail(field.Invalid(path, s, fmt.Sprintf("is not an object name (1-%d characters, no '/' or blanks)", maxNameLength)))
	}
	return s
}

// peer checks a rule's peer as every kind does: a domainName is for
// egress rules only (api/v1alpha1, EndpointInfo and ClusterEndpointInfo);
// an egress entry with a domainName and no cidr (a domainName peer of the
// controller) is a name rule: its canonical name is returned; an egress
// entry with neither is skipped, as the AWS agent v1.5.0 skips it, with a
// warning that says what that does (effect); beside a cidr, a domainName
// is not enforced (the cidr is). It says whether the entry's cidr is to be
// read.
func (v *validator) peer(p *field.Path, dir, cidr, domainName, effect string) (readCIDR bool, name string) {
	switch {
	case domainName != "" && dir == "Ingress":
		v.fail(field.Invalid(p.Child("domainName"), domainName, "is for egress rules only"))
		return false, ""
	case cidr == "" && dir == "Egress":
		if domainName == "" {
			v.warn(p, "no cidr: %s (the AWS agent skips the entry)", effect)
			return false, ""
		}
		name, err := endpoints.ParseDomainName(domainName)
		if err != nil {
			v.fail(field.Invalid(p.Child("domainName"), domainName, err.Error()))
		}
		return false, name
	case domainName != "":
		v.warn(p.Child("domainName"), "%q is not enforced: the entry's cidr %s is", domainName, cidr)
	}
	return true, ""
}

// limit is one bound on an object's size.
type limit struct {
	path   *field.Path
	what   string
	n, max int
}

// withinLimits checks an object of kind against its limits, before
// anything is parsed.
func (v *validator) withinLimits(kind string, limits ...limit) bool {
	for _, c := range limits {
		if c.n > c.max {
			v.fail(field.TooMany(c.path, c.n, c.max))
			v.errs[len(v.errs)-1].Detail = fmt.Sprintf("%d %s, a %s may have at most %d: split the policy", c.n, c.what, kind, c.max)
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

func (v *validator) ports(path *field.Path, in []portInfo) []Port {
	var out []Port
	for i, pi := range in {
		p := path.Index(i)
		port := Port{Protocol: policybpf.ProtocolTCP} // as in Kubernetes
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
