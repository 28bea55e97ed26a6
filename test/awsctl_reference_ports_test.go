package test

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// awsRefPort is one port entry of a rule: a protocol and all its ports, a
// range, or a name to resolve.
type awsRefPort struct {
	proto    corev1.Protocol
	all      bool
	from, to int32
	named    string
}

func awsNPRefPorts(ports []networkingv1.NetworkPolicyPort) []awsRefPort {
	out := make([]awsRefPort, 0, len(ports))
	for _, p := range ports {
		r := awsRefPort{proto: corev1.ProtocolTCP}
		if p.Protocol != nil {
			r.proto = *p.Protocol
		}
		switch {
		case p.Port == nil:
			r.all = true
		case p.Port.Type == intstr.String:
			r.named = p.Port.StrVal
		default:
			r.from, r.to = p.Port.IntVal, p.Port.IntVal
			if p.EndPort != nil {
				r.to = *p.EndPort
			}
		}
		out = append(out, r)
	}
	return out
}

func awsCNPRefPorts(ports []awsCNPPort) []awsRefPort {
	out := make([]awsRefPort, 0, len(ports))
	for _, p := range ports {
		if p.PortNumber != nil {
			out = append(out, awsRefPort{proto: p.PortNumber.Protocol, from: p.PortNumber.Port, to: p.PortNumber.Port})
		}
		if p.PortRange != nil {
			out = append(out, awsRefPort{proto: p.PortRange.Protocol, from: p.PortRange.Start, to: p.PortRange.End})
		}
		if p.NamedPort != nil {
			// A ClusterNetworkPolicy's named port has no protocol: TCP.
			out = append(out, awsRefPort{proto: corev1.ProtocolTCP, named: *p.NamedPort})
		}
	}
	return out
}

// awsNamedOn is the number of the container port named name with proto on
// each pod (pods without it give nothing).
func awsNamedOn(pods []*awsPod, name string, proto corev1.Protocol) []int32 {
	var out []int32
	for _, p := range pods {
		for _, cp := range p.Ports {
			cpProto := cp.Protocol
			if cpProto == "" {
				cpProto = corev1.ProtocolTCP
			}
			if cp.Name == name && cpProto == proto {
				out = append(out, cp.ContainerPort)
				break
			}
		}
	}
	return out
}

// awsPortsMatch says whether a packet's protocol and port are in the rule's
// ports (none: every protocol and port); resolve gives a named port's
// numbers in the rule's context (nil: it matches nothing).
func awsPortsMatch(ports []awsRefPort, q awsQuery, resolve func(name string, proto corev1.Protocol) []int32) (bool, string) {
	if len(ports) == 0 {
		return true, "all ports"
	}
	proto := corev1.Protocol(strings.ToUpper(q.Proto))
	for _, p := range ports {
		if p.proto != proto {
			continue
		}
		switch {
		case p.all:
			return true, "all " + string(proto) + " ports"
		case p.named != "":
			if resolve == nil {
				continue
			}
			nums := resolve(p.named, p.proto)
			if slices.Contains(nums, q.Port) {
				return true, fmt.Sprintf("named port %s=%v", p.named, awsSortedUnique(nums))
			}
		case q.Port >= p.from && q.Port <= p.to:
			if p.from == p.to {
				return true, fmt.Sprintf("%s %d", proto, p.from)
			}
			return true, fmt.Sprintf("%s %d-%d", proto, p.from, p.to)
		}
	}
	return false, ""
}

func awsSortedUnique(nums []int32) []int32 {
	out := slices.Clone(nums)
	slices.Sort(out)
	return slices.Compact(out)
}
