package test

// The PolicyEndpoints the enforcement tests write, and the Kubernetes e2e
// cases that TestPrivilegedNetworkPolicyIsEnforced runs as traffic.

import (
	"fmt"
	"strings"
)

// peRule is an ingress or egress rule of a PolicyEndpoint.
type peRule struct {
	cidr   string
	except []string
	ports  []string // "TCP 80", "UDP 53", "TCP 80-82"
}

// policyEndpoint is a PolicyEndpoint selecting pod, as the AWS network
// policy controller writes it.
func policyEndpoint(name, pod string, isolation []string, ingress, egress []peRule) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: %s, namespace: e2e}\n", name)
	fmt.Fprintf(&b, "spec:\n  policyRef: {name: %s, namespace: e2e}\n  podIsolation: [%s]\n", name, strings.Join(isolation, ", "))
	fmt.Fprintf(&b, "  podSelectorEndpoints:\n  - {podIP: %s, hostIP: %s, name: %s, namespace: e2e}\n", pod, policyNodeIP, name)
	for _, dir := range []struct {
		name  string
		rules []peRule
	}{{"ingress", ingress}, {"egress", egress}} {
		if len(dir.rules) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %s:\n", dir.name)
		for _, r := range dir.rules {
			fmt.Fprintf(&b, "  - cidr: %q\n", r.cidr)
			if len(r.except) > 0 {
				fmt.Fprintf(&b, "    except: [%s]\n", `"`+strings.Join(r.except, `", "`)+`"`)
			}
			if len(r.ports) > 0 {
				b.WriteString("    ports:\n")
				for _, p := range r.ports {
					proto, port, _ := strings.Cut(p, " ")
					start, end, ranged := strings.Cut(port, "-")
					fmt.Fprintf(&b, "    - {protocol: %s", proto)
					if start != "" {
						fmt.Fprintf(&b, ", port: %s", start)
					}
					if ranged {
						fmt.Fprintf(&b, ", endPort: %s", end)
					}
					b.WriteString("}\n")
				}
			}
		}
	}
	return b.String()
}

// probe is one connection attempt: from the pod to the peer (egress) or
// from the peer to the pod (ingress).
type probe struct {
	dir   string // egress, ingress
	proto string // tcp, udp, icmp
	port  int
	allow bool
}

func (p probe) String() string {
	return fmt.Sprintf("%s %s/%d", p.dir, p.proto, p.port)
}

const podA, podB = "10.0.0.2", "10.0.0.3"

// policyCases are NetworkPolicy cases of the Kubernetes e2e suite
// (test/e2e/network/netpol) for pod A, as the PolicyEndpoints the AWS
// controller resolves them to, run as traffic.
var policyCases = []struct {
	name      string
	isolation []string
	ingress   []peRule
	egress    []peRule
	probes    []probe
}{
	{"should support a 'default-deny-ingress' policy", []string{"Ingress"}, nil, nil, []probe{
		{"ingress", "tcp", 80, false}, {"ingress", "udp", 53, false}, {"ingress", "icmp", 0, false},
		{"egress", "tcp", 80, true}, {"egress", "udp", 53, true}, {"egress", "icmp", 0, true},
	}},
	{"should support a 'default-deny-all' policy", []string{"Ingress", "Egress"}, nil, nil, []probe{
		{"ingress", "tcp", 80, false}, {"egress", "tcp", 80, false}, {"egress", "udp", 53, false}, {"egress", "icmp", 0, false},
	}},
	{"should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector (as the peer's CIDR)",
		[]string{"Ingress"}, []peRule{{cidr: policyPeerIP + "/32"}}, nil, []probe{
			{"ingress", "tcp", 80, true}, {"ingress", "tcp", 8080, true}, {"ingress", "udp", 53, true},
		}},
	{"should enforce policy based on Ports [Feature:NetworkPolicy]", []string{"Ingress"},
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}}, nil, []probe{
			{"ingress", "tcp", 80, true}, {"ingress", "tcp", 81, false}, {"ingress", "udp", 80, false},
		}},
	{"should enforce multiple, stacked policies with overlapping podSelectors", []string{"Ingress"},
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}, {cidr: "10.0.1.0/24", ports: []string{"TCP 81"}}}, nil, []probe{
			{"ingress", "tcp", 80, true}, {"ingress", "tcp", 81, true}, {"ingress", "tcp", 82, false},
		}},
	{"should enforce except clause while egress access to server in CIDR block", []string{"Egress"}, nil,
		[]peRule{{cidr: "10.0.1.0/24", except: []string{policyPeerIP + "/32"}}}, []probe{
			{"egress", "tcp", 80, false}, {"egress", "udp", 53, false}, {"ingress", "tcp", 80, true},
		}},
	{"should allow egress access on one named port (as the port it resolves to)", []string{"Egress"}, nil,
		[]peRule{{cidr: "0.0.0.0/0", ports: []string{"UDP 53"}}}, []probe{
			{"egress", "udp", 53, true}, {"egress", "tcp", 53, false}, {"egress", "tcp", 80, false},
		}},
	{"should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
		[]string{"Egress"}, nil, []peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}}, []probe{
			{"egress", "tcp", 80, true}, {"egress", "tcp", 81, false}, {"egress", "icmp", 0, false}, {"ingress", "tcp", 81, true},
		}},
	{"should support allow-all policy", []string{"Ingress", "Egress"},
		[]peRule{{cidr: "0.0.0.0/0"}}, []peRule{{cidr: "0.0.0.0/0"}}, []probe{
			{"ingress", "tcp", 80, true}, {"egress", "tcp", 443, true}, {"egress", "icmp", 0, true}, {"ingress", "icmp", 0, true},
		}},
	{"should enforce policy to allow ingress traffic from pods in all namespaces (ipBlock with except)", []string{"Ingress"},
		[]peRule{{cidr: "10.0.0.0/16", except: []string{"10.0.1.0/25"}}}, nil, []probe{
			{"ingress", "tcp", 80, false}, {"egress", "tcp", 80, true},
		}},
	{"should support a port range with endPort", []string{"Egress"}, nil,
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80-82"}}}, []probe{
			{"egress", "tcp", 80, true}, {"egress", "tcp", 82, true}, {"egress", "tcp", 83, false},
		}},
	{"should allow ingress and egress in both directions with their own rules", []string{"Ingress", "Egress"},
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 8080"}}}, []peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 443"}}}, []probe{
			{"ingress", "tcp", 8080, true}, {"ingress", "tcp", 443, false}, {"egress", "tcp", 443, true}, {"egress", "tcp", 8080, false},
		}},
	{"should deny ingress access to updated pod (the peer's CIDR no longer allowed)", []string{"Ingress"},
		[]peRule{{cidr: "10.0.2.0/24"}}, nil, []probe{
			{"ingress", "tcp", 80, false}, {"ingress", "icmp", 0, false}, {"egress", "tcp", 80, true},
		}},
	{"should allow ingress access from updated namespace", []string{"Ingress"},
		[]peRule{{cidr: "10.0.1.0/24"}}, nil, []probe{
			{"ingress", "tcp", 80, true}, {"ingress", "icmp", 0, true},
		}},
	{"should work with Ingress, Egress specified together", []string{"Ingress", "Egress"},
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}}, []peRule{{cidr: policyPeerIP + "/32", ports: []string{"UDP 53"}}}, []probe{
			{"ingress", "tcp", 80, true}, {"ingress", "udp", 53, false}, {"egress", "udp", 53, true}, {"egress", "tcp", 80, false},
		}},
	{"should enforce egress policy allowing traffic to everything but a CIDR block", []string{"Egress"}, nil,
		[]peRule{{cidr: "0.0.0.0/0", except: []string{"10.0.1.0/24"}}}, []probe{
			{"egress", "tcp", 80, false}, {"egress", "icmp", 0, false}, {"ingress", "tcp", 80, true},
		}},
	{"should enforce ingress policy allowing any port traffic to a server on a specific protocol", []string{"Ingress"},
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"UDP"}}}, nil, []probe{
			{"ingress", "udp", 53, true}, {"ingress", "udp", 81, true}, {"ingress", "tcp", 80, false},
		}},
	{"should not allow access by TCP when a policy specifies only UDP", []string{"Egress"}, nil,
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"UDP 53"}}}, []probe{
			{"egress", "udp", 53, true}, {"egress", "tcp", 53, false},
		}},
	{"should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
		[]string{"Ingress", "Egress"}, []peRule{{cidr: "0.0.0.0/0"}}, nil, []probe{
			{"egress", "tcp", 80, false}, {"egress", "udp", 53, false}, {"ingress", "tcp", 80, true}, {"ingress", "udp", 53, true},
		}},
	{"should allow every protocol, ICMP too, with a rule without ports", []string{"Egress"}, nil,
		[]peRule{{cidr: "10.0.1.0/24"}}, []probe{
			{"egress", "icmp", 0, true}, {"egress", "tcp", 8080, true}, {"egress", "udp", 53, true},
		}},
	// The seed's case: an IPv6 rule with excepts beside IPv4 rules, on an
	// IPv4-only node, changes no IPv4 outcome.
	{"the seed: ::/0 except [100::/64, fe80::/10] on TCP 443 next to IPv4 rules", []string{"Egress"}, nil,
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}, {cidr: "::/0", except: []string{"100::/64", "fe80::/10"}, ports: []string{"TCP 443"}}}, []probe{
			{"egress", "tcp", 80, true}, {"egress", "tcp", 443, false}, {"egress", "udp", 53, false},
		}},
}
