package test

// The scenario of the AWS network policy controller suites: four
// namespaces, pods on this node and on another, ten NetworkPolicies, six
// ClusterNetworkPolicies (both tiers, Accept, Deny, Pass, a tie, a named
// port, domain names) and two ApplicationNetworkPolicies, which together
// use every field of the three APIs at least once; the cases judged on
// them, each with the answer its author reads in the APIs (which
// TestAWSControllerReference checks the reference evaluator against); and
// the churn applied to them. Pod names are unique across namespaces so
// that a case can name a pod alone.
//
// Field coverage (NetworkPolicy): podSelector with matchLabels
// (web-ingress), matchExpressions (api) and empty (default-deny-egress,
// shop-dns); policyTypes Ingress, Egress, both and omitted (web-ingress:
// Ingress; tool-ingress: Ingress and Egress); ingress and egress peers
// podSelector, namespaceSelector, both, ipBlock with except; ports with
// protocol TCP, UDP, SCTP and omitted, numbers, named ports (web-ingress,
// api, db), endPort (api), a protocol alone (db); an empty rule (cache
// ingress), no from (mon), no to (tool-egress).
// ClusterNetworkPolicy: tier Admin and Baseline; priorities 10 to 50 in
// order, and a tie at 20 across two policies; actions Accept, Deny, Pass;
// subject namespaces and pods; peers namespaces, pods, networks,
// domainNames; ports portNumber, portRange, namedPort (egress: per
// destination pod; ingress: the union over the subject's pods).
// ApplicationNetworkPolicy: podSelector, policyTypes, ingress, egress
// ports and peers podSelector, namespaceSelector, ipBlock with except,
// domainNames.

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Addresses of the scenario. Pods of this node are in 10.0.0.0/24 behind
// veths of the policy node; pods of the other node, and the addresses
// outside the cluster, are answered by the peer netns.
const (
	awsNodeIP       = policyNodeIP // 10.0.1.1, every local pod's hostIP
	awsRemoteHostIP = "10.0.2.1"   // the other node

	awsExtPeer   = policyPeerIP // 10.0.1.2
	awsExt130    = "10.0.1.130"
	awsExt200    = "10.0.1.200"
	awsExt250    = "10.0.1.250"
	awsOutside5  = "192.168.50.5"
	awsOutside20 = "192.168.50.20"
)

// awsOutsideNet is routed from the node to the peer netns.
const awsOutsideNet = "192.168.50.0/24"

// awsExternal are the addresses outside the cluster that the peer netns
// answers on (besides policyPeerIP and the remote pods).
var awsExternal = []string{awsExt130, awsExt200, awsExt250, awsOutside5, awsOutside20}

// awsExtraPorts are the ports of the cases that policyPorts lacks: every
// pod and peer address serves them too (TCP and UDP).
func awsExtraPorts() []int {
	seen := map[int]bool{}
	for _, p := range policyPorts {
		seen[p] = true
	}
	var out []int
	cases := awsStaticCases()
	for _, step := range awsChurnSteps() {
		cases = append(cases, step.expect...)
	}
	for _, k := range cases {
		if p := int(k.port); !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// awsScenario is the world the suites start from.
func awsScenario() *awsWorld {
	local := func(ns, name, ip string, l map[string]string, ports ...corev1.ContainerPort) awsPod {
		return awsPod{Namespace: ns, Name: name, IP: ip, Local: true, Labels: l, Ports: ports}
	}
	remote := func(ns, name, ip string, l map[string]string, ports ...corev1.ContainerPort) awsPod {
		return awsPod{Namespace: ns, Name: name, IP: ip, Labels: l, Ports: ports}
	}
	return &awsWorld{
		NodeIP: awsNodeIP,
		Namespaces: map[string]map[string]string{
			"shop": awsLabels("team", "shop", "env", "prod"),
			"data": awsLabels("team", "data", "env", "prod"),
			"dev":  awsLabels("team", "dev", "env", "dev"),
			"ops":  awsLabels("team", "ops", "env", "prod"),
		},
		Pods: []awsPod{
			local("shop", "web-1", "10.0.0.11", awsLabels("app", "web", "role", "front"), awsTCPPort("http", 8080)),
			local("shop", "web-2", "10.0.0.12", awsLabels("app", "web", "role", "front"), awsTCPPort("http", 8081)),
			local("shop", "api", "10.0.0.13", awsLabels("app", "api"), awsTCPPort("grpc", 9090)),
			local("data", "db", "10.0.0.21", awsLabels("app", "db"), awsTCPPort("pg", 5432)),
			local("data", "cache", "10.0.0.22", awsLabels("app", "cache")),
			local("dev", "tool", "10.0.0.31", awsLabels("app", "tool")),
			local("dev", "sandbox", "10.0.0.32", awsLabels("app", "sandbox")),
			local("ops", "mon", "10.0.0.41", awsLabels("app", "mon"), awsTCPPort("metrics", 9090)),
			remote("shop", "web-3", "10.0.1.13", awsLabels("app", "web", "role", "front"), awsTCPPort("http", 8080)),
			remote("shop", "client", "10.0.1.11", awsLabels("app", "client")),
			remote("data", "batch", "10.0.1.21", awsLabels("app", "batch")),
			remote("dev", "probe", "10.0.1.31", awsLabels("app", "probe"), awsTCPPort("http", 8080)),
			remote("ops", "scraper", "10.0.1.41", awsLabels("app", "scraper")),
		},
		NetworkPolicies: []networkingv1.NetworkPolicy{
			awsNetworkPolicy("shop", "web-ingress", awsSel("app", "web"), nil, []networkingv1.NetworkPolicyIngressRule{
				{From: awsFrom(awsPeerPods(awsSel("app", "client"))), Ports: awsPorts(awsPort("", "http"))},
				{From: awsFrom(awsPeerNS(awsSel("team", "ops"))), Ports: awsPorts(awsPort(awsTCP, 9090))},
			}, nil),
			awsNetworkPolicy("shop", "api", awsSelExpr("app", metav1.LabelSelectorOpIn, "api"), awsBothTypes, []networkingv1.NetworkPolicyIngressRule{
				{From: awsFrom(awsPeerNSPods(awsSel("env", "prod"), awsSel("app", "batch")))},
				{From: awsFrom(awsPeerPods(awsSel("app", "web"))), Ports: awsPorts(awsPort(awsTCP, 9090))},
			}, []networkingv1.NetworkPolicyEgressRule{
				{To: awsFrom(awsPeerNSPods(awsSel("team", "data"), awsSel("app", "db"))), Ports: awsPorts(awsPort("", "pg"))},
				{To: awsFrom(awsPeerBlock("10.0.1.0/24", "10.0.1.192/26")), Ports: awsPorts(awsPort(awsUDP, 53), awsPort(awsTCP, 8000, 8100))},
			}),
			awsNetworkPolicy("shop", "web-egress", awsSel("role", "front"), awsEgressOnly, nil, []networkingv1.NetworkPolicyEgressRule{
				{To: awsFrom(awsPeerPods(awsSel("app", "api"))), Ports: awsPorts(awsPort(awsTCP, 9090))},
				{To: awsFrom(awsPeerNSPods(awsSel("team", "data"), awsSel("app", "db"))), Ports: awsPorts(awsPort(awsTCP, 5432))},
				{To: awsFrom(awsPeerBlock("0.0.0.0/0", "10.0.0.0/8"))},
			}),
			awsNetworkPolicy("shop", "shop-dns", awsSel(), awsEgressOnly, nil, []networkingv1.NetworkPolicyEgressRule{
				{To: awsFrom(awsPeerBlock(awsExtPeer + "/32")), Ports: awsPorts(awsPort(awsUDP, 53), awsPort(awsTCP, 53))},
			}),
			awsNetworkPolicy("data", "db", awsSel("app", "db"), awsIngressOnly, []networkingv1.NetworkPolicyIngressRule{
				{From: awsFrom(awsPeerNS(awsSel("team", "shop"))), Ports: awsPorts(awsPort("", "pg"))},
				{From: awsFrom(awsPeerBlock("10.0.1.128/25", "10.0.1.192/27")), Ports: awsPorts(awsPort(awsSCTP, 5432), awsPort(awsUDP, nil))},
			}, nil),
			awsNetworkPolicy("data", "default-deny-egress", awsSel(), awsEgressOnly, nil, nil),
			awsNetworkPolicy("data", "cache", awsSel("app", "cache"), awsBothTypes,
				[]networkingv1.NetworkPolicyIngressRule{{}},
				[]networkingv1.NetworkPolicyEgressRule{{To: awsFrom(awsPeerNS(awsSel()))}}),
			awsNetworkPolicy("dev", "tool-egress", awsSel("app", "tool"), awsEgressOnly, nil, []networkingv1.NetworkPolicyEgressRule{
				{Ports: awsPorts(awsPort(awsTCP, 443), awsPort(awsUDP, 53))},
				{To: awsFrom(awsPeerPods(awsSel()))},
			}),
			awsNetworkPolicy("dev", "tool-ingress", awsSel("app", "tool"), nil, []networkingv1.NetworkPolicyIngressRule{
				{From: awsFrom(awsPeerPods(awsSel("app", "probe"))), Ports: awsPorts(awsPort(awsUDP, 53))},
			}, []networkingv1.NetworkPolicyEgressRule{
				{To: awsFrom(awsPeerBlock(awsOutsideNet))},
			}),
			awsNetworkPolicy("ops", "mon", awsSel("app", "mon"), awsIngressOnly, []networkingv1.NetworkPolicyIngressRule{
				{Ports: awsPorts(awsPort(awsTCP, 9090))},
			}, nil),
		},
		ANPs: []awsANP{
			awsANPOf("shop", "api-app", awsSel("app", "api"), awsBothTypes, []networkingv1.NetworkPolicyIngressRule{
				{From: awsFrom(awsPeerPods(awsSel("app", "client"))), Ports: awsPorts(awsPort(awsTCP, 8080))},
			}, []awsANPEgress{
				{To: []awsANPPeer{{DomainNames: []string{"api.example.com"}}}, Ports: awsPorts(awsPort(awsTCP, 443))},
				{To: []awsANPPeer{{IPBlock: awsIPBlock(awsOutsideNet, "192.168.50.0/28")}}, Ports: awsPorts(awsPort(awsTCP, 443))},
				{To: []awsANPPeer{{PodSelector: awsSel("app", "web")}}, Ports: awsPorts(awsPort(awsTCP, 8080))},
				{To: []awsANPPeer{{NamespaceSelector: awsSel("team", "ops")}}},
			}),
			awsANPOf("dev", "sandbox-fqdn", awsSel("app", "sandbox"), awsEgressOnly, nil, []awsANPEgress{
				{To: []awsANPPeer{{DomainNames: []string{"*.example.com"}}}},
			}),
		},
		CNPs: []awsCNP{
			awsCNPOf("admin-guard", "Admin", 10, awsCNPSubject{Namespaces: awsSel("env", "prod")}, []awsCNPIngress{
				{Action: "Deny", From: awsCNPPeers(awsCNPNamespaces(awsSel("team", "dev"))), Ports: awsCNPPortList(awsCNPNum(awsTCP, 5432))},
				{Action: "Accept", From: awsCNPPeers(awsCNPPods(awsSel("team", "ops"), awsSel("app", "scraper"))), Ports: awsCNPPortList(awsCNPRange(awsTCP, 9000, 9100))},
			}, []awsCNPEgress{
				{Action: "Deny", To: awsCNPPeers(awsCNPNetworks("192.168.50.0/28"))},
				{Action: "Pass", To: awsCNPPeers(awsCNPNetworks("10.0.1.0/24")), Ports: awsCNPPortList(awsCNPNum(awsUDP, 53))},
			}),
			awsCNPOf("admin-lockdown", "Admin", 20, awsCNPSubject{Pods: &awsNamespacedPod{
				NamespaceSelector: *awsSel("env", "prod"), PodSelector: *awsSelExpr("app", metav1.LabelSelectorOpIn, "cache", "api", "web")}},
				[]awsCNPIngress{
					{Action: "Accept", From: awsCNPPeers(awsCNPNamespaces(awsSel())), Ports: awsCNPPortList(awsCNPNum(awsTCP, 443))},
				}, []awsCNPEgress{
					{Action: "Deny", To: awsCNPPeers(awsCNPNetworks("10.0.1.0/24")), Ports: awsCNPPortList(awsCNPNum(awsUDP, 53), awsCNPNum(awsTCP, 80))},
					{Action: "Accept", To: awsCNPPeers(awsCNPPods(awsSel("team", "shop"), awsSel("app", "web"))), Ports: awsCNPPortList(awsCNPNamed("http"))},
				}),
			awsCNPOf("admin-tie", "Admin", 20, awsCNPSubject{Namespaces: awsSel("team", "shop")}, []awsCNPIngress{
				{Action: "Deny", From: awsCNPPeers(awsCNPNamespaces(awsSel("team", "dev"))), Ports: awsCNPPortList(awsCNPNum(awsTCP, 443))},
				{Action: "Pass", From: awsCNPPeers(awsCNPNamespaces(awsSel("team", "shop"))), Ports: awsCNPPortList(awsCNPNum(awsTCP, 443))},
				{Action: "Accept", From: awsCNPPeers(awsCNPNamespaces(awsSel("team", "ops"))), Ports: awsCNPPortList(awsCNPNamed("http"))},
			}, nil),
			awsCNPOf("admin-fqdn", "Admin", 30, awsCNPSubject{Pods: &awsNamespacedPod{NamespaceSelector: *awsSel("team", "dev"), PodSelector: *awsSel("app", "sandbox")}},
				nil, []awsCNPEgress{
					{Action: "Accept", To: awsCNPPeers(awsCNPDomains("example.com", "*.example.org")), Ports: awsCNPPortList(awsCNPNum(awsTCP, 443))},
					{Action: "Deny", To: awsCNPPeers(awsCNPNetworks("10.0.1.0/25")), Ports: awsCNPPortList(awsCNPNum(awsTCP, 443))},
				}),
			awsCNPOf("baseline-accept", "Baseline", 40, awsCNPSubject{Namespaces: awsSel()}, nil, []awsCNPEgress{
				{Action: "Accept", To: awsCNPPeers(awsCNPNetworks(awsOutsideNet)), Ports: awsCNPPortList(awsCNPNum(awsTCP, 80))},
				{Action: "Pass", To: awsCNPPeers(awsCNPNetworks(awsOutside20 + "/32")), Ports: awsCNPPortList(awsCNPNum(awsTCP, 81))},
			}),
			awsCNPOf("baseline-deny", "Baseline", 50, awsCNPSubject{Namespaces: awsSel()}, []awsCNPIngress{
				{Action: "Deny", From: awsCNPPeers(awsCNPNamespaces(awsSel("team", "dev")))},
			}, []awsCNPEgress{
				{Action: "Deny", To: awsCNPPeers(awsCNPNetworks(awsOutsideNet))},
			}),
		},
	}
}

// awsCase is one packet judged: pod and peer by name (a pod of the
// scenario, "node", or an address), and the answer the author reads in the
// APIs ("ALLOW namespace", "DENY admin", ...), which the reference must
// give too.
type awsCase struct {
	pod, dir, peer, proto string
	port                  int32
	want                  string
}

// awsC is a case: dir "in" or "out".
func awsC(pod, dir, peer, proto string, port int32, want string) awsCase {
	d := map[string]string{"in": "ingress", "out": "egress"}[dir]
	return awsCase{pod: pod, dir: d, peer: peer, proto: proto, port: port, want: want}
}

// awsStaticCases are judged on awsScenario at each chunk size. ★ marks
// the cases that show a rule of the semantics (tie, Pass, a named port's
// union, FQDN allowing nothing, Baseline only where not isolated).
func awsStaticCases() []awsCase {
	return []awsCase{
		// web-1, web-2: ingress isolated by web-ingress (named port http:
		// the union 8080, 8081 over web-1, web-2, web-3).
		awsC("web-1", "in", "client", "tcp", 8080, "ALLOW namespace"),
		awsC("web-1", "in", "client", "tcp", 8081, "ALLOW namespace"), // ★ the named port's union: web-1's own http is 8080
		awsC("web-1", "in", "client", "tcp", 80, "DENY namespace"),
		awsC("web-1", "in", "batch", "tcp", 8080, "DENY namespace"),
		awsC("web-1", "in", "scraper", "tcp", 9090, "ALLOW admin"),
		awsC("web-1", "in", "mon", "tcp", 9090, "ALLOW namespace"),
		awsC("web-1", "in", "mon", "tcp", 9101, "DENY namespace"),
		awsC("web-1", "in", "probe", "tcp", 443, "DENY admin"),   // ★ tie at 20: Deny (admin-tie) over Accept (admin-lockdown)
		awsC("web-1", "in", "client", "tcp", 443, "ALLOW admin"), // ★ tie at 20: Accept over Pass
		awsC("web-1", "in", awsExtPeer, "tcp", 443, "DENY namespace"),
		awsC("web-1", "in", "node", "tcp", 80, "ALLOW admin"),
		awsC("web-1", "in", "probe", "tcp", 5432, "DENY admin"),
		awsC("web-1", "in", "tool", "tcp", 5432, "DENY admin"),
		awsC("web-2", "in", "client", "tcp", 8080, "ALLOW namespace"), // ★ the union: web-2's own http is 8081
		awsC("web-2", "in", "client", "tcp", 8081, "ALLOW namespace"),
		awsC("web-2", "in", "client", "udp", 8080, "DENY namespace"),
		// web-1, web-2: egress isolated by web-egress and shop-dns.
		awsC("web-1", "out", "api", "tcp", 9090, "ALLOW namespace"),
		awsC("web-1", "out", "api", "tcp", 80, "DENY namespace"),
		awsC("web-1", "out", "db", "tcp", 5432, "ALLOW namespace"),
		awsC("web-1", "out", "db", "udp", 5432, "DENY namespace"),
		awsC("web-1", "out", awsExtPeer, "udp", 53, "ALLOW namespace"), // ★ Pass at 10 over the Deny at 20
		awsC("web-1", "out", awsExtPeer, "tcp", 53, "ALLOW namespace"),
		awsC("web-1", "out", awsExtPeer, "tcp", 80, "DENY admin"),
		awsC("web-1", "out", awsExt130, "udp", 53, "DENY namespace"),
		awsC("web-1", "out", awsOutside5, "tcp", 80, "DENY admin"),
		awsC("web-1", "out", awsOutside20, "tcp", 80, "ALLOW namespace"), // ★ Baseline not asked: isolated
		awsC("web-1", "out", "web-2", "tcp", 8081, "ALLOW admin"),        // ★ a CNP's named port, per destination pod
		awsC("web-1", "out", "web-2", "tcp", 8080, "DENY namespace"),
		awsC("web-1", "out", "web-3", "tcp", 8080, "ALLOW admin"),
		awsC("web-1", "out", "web-3", "tcp", 80, "DENY admin"),
		awsC("web-1", "out", "node", "tcp", 80, "ALLOW admin"),
		awsC("web-2", "out", "db", "tcp", 5432, "ALLOW namespace"),
		// api: NetworkPolicy api and ApplicationNetworkPolicy api-app.
		awsC("api", "in", "batch", "tcp", 80, "ALLOW namespace"),
		awsC("api", "in", "batch", "udp", 53, "ALLOW namespace"),
		awsC("api", "in", "batch", "sctp", 9, "ALLOW namespace"),
		awsC("api", "in", "web-1", "tcp", 9090, "ALLOW namespace"),
		awsC("api", "in", "web-1", "tcp", 80, "DENY namespace"),
		awsC("api", "in", "client", "tcp", 8080, "ALLOW namespace"),
		awsC("api", "in", "client", "tcp", 9090, "DENY namespace"),
		awsC("api", "in", "client", "tcp", 443, "ALLOW admin"),
		awsC("api", "in", "probe", "tcp", 443, "DENY admin"),
		awsC("api", "in", "scraper", "tcp", 9100, "ALLOW admin"),
		awsC("api", "in", "scraper", "tcp", 9101, "DENY namespace"),
		awsC("api", "in", awsExt130, "tcp", 443, "DENY namespace"),
		awsC("api", "in", "mon", "tcp", 8081, "ALLOW admin"), // ★ a CNP ingress named port: the union over the subject's pods (api has no http)
		awsC("api", "in", "mon", "udp", 8080, "DENY namespace"),
		awsC("web-1", "in", "scraper", "tcp", 8081, "ALLOW admin"),
		awsC("api", "out", "db", "tcp", 5432, "ALLOW namespace"),
		awsC("api", "out", "db", "tcp", 80, "DENY namespace"),
		awsC("api", "out", "cache", "tcp", 5432, "DENY namespace"),
		awsC("api", "out", awsExt130, "udp", 53, "ALLOW namespace"),
		awsC("api", "out", awsExt200, "udp", 53, "DENY namespace"),
		awsC("api", "out", awsExt130, "tcp", 8000, "ALLOW namespace"),
		awsC("api", "out", awsExt130, "tcp", 8100, "ALLOW namespace"),
		awsC("api", "out", awsExt130, "tcp", 8101, "DENY namespace"),
		awsC("api", "out", awsExt130, "tcp", 80, "DENY admin"),
		awsC("api", "out", awsExtPeer, "udp", 53, "ALLOW namespace"),
		awsC("api", "out", awsOutside20, "tcp", 443, "ALLOW namespace"),
		awsC("api", "out", awsOutside5, "tcp", 443, "DENY admin"),
		awsC("api", "out", awsOutside20, "tcp", 80, "DENY namespace"),
		awsC("api", "out", "web-2", "tcp", 8080, "ALLOW namespace"),
		awsC("api", "out", "web-2", "tcp", 8081, "ALLOW admin"),
		awsC("api", "out", "mon", "tcp", 81, "ALLOW namespace"),
		awsC("api", "out", "scraper", "udp", 5432, "ALLOW namespace"),
		awsC("api", "out", "scraper", "udp", 53, "ALLOW namespace"),
		// db: ingress by db (named pg, SCTP, a protocol alone, except),
		// egress denied by default-deny-egress.
		awsC("db", "in", "web-1", "tcp", 5432, "ALLOW namespace"),
		awsC("db", "in", "client", "tcp", 5432, "ALLOW namespace"),
		awsC("db", "in", "client", "tcp", 80, "DENY namespace"),
		awsC("db", "in", "tool", "tcp", 5432, "DENY admin"),
		awsC("db", "in", "batch", "tcp", 5432, "DENY namespace"),
		awsC("db", "in", awsExt130, "sctp", 5432, "ALLOW namespace"),
		awsC("db", "in", awsExt130, "udp", 9999, "ALLOW namespace"),
		awsC("db", "in", awsExt130, "tcp", 5432, "DENY namespace"),
		awsC("db", "in", awsExt200, "udp", 53, "DENY namespace"),
		awsC("db", "in", awsExt250, "udp", 53, "ALLOW namespace"),
		awsC("db", "in", "scraper", "tcp", 9090, "ALLOW admin"),
		awsC("db", "out", awsExtPeer, "tcp", 80, "DENY namespace"),
		awsC("db", "out", awsExtPeer, "udp", 53, "DENY namespace"),
		awsC("db", "out", "web-1", "tcp", 8080, "DENY namespace"),
		awsC("db", "out", "node", "tcp", 80, "ALLOW admin"),
		// cache: an empty ingress rule, egress to every pod.
		awsC("cache", "in", "probe", "tcp", 5432, "DENY admin"), // ★ Admin Deny over an allow-all NetworkPolicy
		awsC("cache", "in", "probe", "tcp", 80, "ALLOW namespace"),
		awsC("cache", "in", awsExt250, "sctp", 9, "ALLOW namespace"),
		awsC("cache", "in", "client", "tcp", 443, "ALLOW admin"),
		awsC("cache", "out", "probe", "udp", 53, "ALLOW namespace"), // ★ Pass hands over to the NetworkPolicy
		awsC("cache", "out", "probe", "tcp", 80, "DENY admin"),
		awsC("cache", "out", "web-2", "tcp", 8081, "ALLOW admin"),
		awsC("cache", "out", "web-1", "tcp", 9090, "ALLOW namespace"),
		awsC("cache", "out", awsExtPeer, "tcp", 443, "DENY namespace"),
		awsC("cache", "out", awsOutside20, "tcp", 80, "DENY namespace"),
		// tool: two NetworkPolicies, one with policyTypes omitted.
		awsC("tool", "in", "probe", "udp", 53, "ALLOW namespace"),
		awsC("tool", "in", "probe", "tcp", 53, "DENY namespace"),
		awsC("tool", "in", awsExtPeer, "tcp", 80, "DENY namespace"),
		awsC("tool", "out", awsExtPeer, "tcp", 443, "ALLOW namespace"),
		awsC("tool", "out", awsExtPeer, "tcp", 80, "DENY namespace"),
		awsC("tool", "out", awsExt250, "udp", 53, "ALLOW namespace"),
		awsC("tool", "out", "probe", "tcp", 80, "ALLOW namespace"),
		awsC("tool", "out", "sandbox", "tcp", 81, "ALLOW namespace"),
		awsC("tool", "out", "web-1", "tcp", 80, "DENY namespace"),
		awsC("tool", "out", awsOutside5, "tcp", 80, "ALLOW namespace"),
		awsC("tool", "out", awsOutside20, "sctp", 7, "ALLOW namespace"),
		// sandbox: no ingress policy (Baseline decides); egress isolated by
		// FQDN rules only.
		awsC("sandbox", "in", "probe", "tcp", 80, "DENY baseline"),
		awsC("sandbox", "in", "client", "tcp", 80, "ALLOW default"),
		awsC("sandbox", "in", "tool", "udp", 53, "DENY baseline"),
		awsC("sandbox", "out", awsExtPeer, "tcp", 443, "DENY admin"),
		awsC("sandbox", "out", awsExtPeer, "tcp", 80, "DENY namespace"), // ★ FQDN allows nothing
		awsC("sandbox", "out", awsExt130, "tcp", 443, "DENY namespace"),
		awsC("sandbox", "out", "node", "tcp", 53, "ALLOW admin"),
		// mon: ingress from anywhere on 9090; egress left to the tiers.
		awsC("mon", "in", "probe", "tcp", 9090, "ALLOW namespace"), // ★ the Baseline Deny of dev not asked: isolated
		awsC("mon", "in", "probe", "tcp", 80, "DENY namespace"),
		awsC("mon", "in", awsExt250, "tcp", 9090, "ALLOW namespace"),
		awsC("mon", "in", "scraper", "tcp", 9095, "ALLOW admin"),
		awsC("mon", "out", awsOutside20, "tcp", 80, "ALLOW baseline"), // ★ Baseline priority 40 over 50
		awsC("mon", "out", awsOutside20, "tcp", 81, "ALLOW default"),  // ★ a Baseline Pass goes to the default
		awsC("mon", "out", awsOutside20, "tcp", 82, "DENY baseline"),
		awsC("mon", "out", awsOutside5, "tcp", 80, "DENY admin"),
		awsC("mon", "out", awsExtPeer, "udp", 53, "ALLOW default"),
		awsC("mon", "out", awsExtPeer, "tcp", 80, "ALLOW default"),
	}
}

// awsName is a pod's namespace/name and IP, by the name cases use.
type awsName struct{ key, ip string }

// awsNames are the pods of w by name, and "node".
func awsNames(w *awsWorld) map[string]awsName {
	out := map[string]awsName{"node": {ip: w.NodeIP}}
	for _, p := range w.Pods {
		out[p.Name] = awsName{key: p.key(), ip: p.IP}
	}
	return out
}

// query is the case's packet: names resolved in names (a pod that has
// gone keeps the name of the address it had).
func (k awsCase) query(names map[string]awsName) (awsQuery, error) {
	pod, ok := names[k.pod]
	if !ok || pod.key == "" {
		return awsQuery{}, fmt.Errorf("case %s: no pod %q", k, k.pod)
	}
	peer := k.peer
	if n, ok := names[k.peer]; ok {
		peer = n.ip
	} else if _, err := netip.ParseAddr(peer); err != nil {
		return awsQuery{}, fmt.Errorf("case %s: peer %q is neither a pod, node nor an address", k, k.peer)
	}
	return awsQuery{Pod: pod.key, Dir: k.dir, Peer: peer, Proto: k.proto, Port: k.port}, nil
}
