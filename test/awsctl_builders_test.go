package test

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func awsLabels(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// awsSel is a matchLabels selector of key, value pairs (none: empty, all).
func awsSel(kv ...string) *metav1.LabelSelector {
	if len(kv) == 0 {
		return &metav1.LabelSelector{}
	}
	return &metav1.LabelSelector{MatchLabels: awsLabels(kv...)}
}

// awsSelExpr is a selector of one matchExpressions requirement.
func awsSelExpr(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func awsTCPPort(name string, port int32) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, ContainerPort: port, Protocol: corev1.ProtocolTCP}
}

// awsPort is a NetworkPolicyPort: proto "" leaves the protocol to the API
// server's default (TCP); port an int, a name, or nil (all ports).
func awsPort(proto corev1.Protocol, p any, endPort ...int32) networkingv1.NetworkPolicyPort {
	out := networkingv1.NetworkPolicyPort{}
	if proto != "" {
		out.Protocol = &proto
	}
	switch v := p.(type) {
	case int:
		ios := intstr.FromInt32(int32(v))
		out.Port = &ios
	case string:
		ios := intstr.FromString(v)
		out.Port = &ios
	}
	if len(endPort) > 0 {
		out.EndPort = &endPort[0]
	}
	return out
}

const (
	awsTCP  = corev1.ProtocolTCP
	awsUDP  = corev1.ProtocolUDP
	awsSCTP = corev1.ProtocolSCTP
)

func awsIPBlock(cidr string, except ...string) *networkingv1.IPBlock {
	return &networkingv1.IPBlock{CIDR: cidr, Except: except}
}

func awsNetworkPolicy(ns, name string, podSelector *metav1.LabelSelector, types []networkingv1.PolicyType,
	ingress []networkingv1.NetworkPolicyIngressRule, egress []networkingv1.NetworkPolicyEgressRule) networkingv1.NetworkPolicy {
	return networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: *podSelector, PolicyTypes: types, Ingress: ingress, Egress: egress},
	}
}

var (
	awsIngressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	awsEgressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	awsBothTypes   = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
)

func awsFrom(peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return peers }

func awsPeerPods(podSel *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: podSel}
}

func awsPeerNS(nsSel *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: nsSel}
}

func awsPeerNSPods(nsSel, podSel *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: nsSel, PodSelector: podSel}
}

func awsPeerBlock(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: awsIPBlock(cidr, except...)}
}

func awsPorts(p ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyPort { return p }

func awsCNPOf(name, tier string, priority int32, subject awsCNPSubject, ingress []awsCNPIngress, egress []awsCNPEgress) awsCNP {
	return awsCNP{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.aws/v1alpha1", Kind: "ClusterNetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       awsCNPSpec{Tier: tier, Priority: priority, Subject: subject, Ingress: ingress, Egress: egress},
	}
}

func awsCNPNamespaces(nsSel *metav1.LabelSelector) awsCNPPeer { return awsCNPPeer{Namespaces: nsSel} }

func awsCNPPods(nsSel, podSel *metav1.LabelSelector) awsCNPPeer {
	return awsCNPPeer{Pods: &awsNamespacedPod{NamespaceSelector: *nsSel, PodSelector: *podSel}}
}

func awsCNPNetworks(cidrs ...string) awsCNPPeer    { return awsCNPPeer{Networks: cidrs} }
func awsCNPDomains(names ...string) awsCNPPeer     { return awsCNPPeer{DomainNames: names} }
func awsCNPPeers(p ...awsCNPPeer) []awsCNPPeer     { return p }
func awsCNPPortList(p ...awsCNPPort) *[]awsCNPPort { return &p }

func awsCNPNum(proto corev1.Protocol, port int32) awsCNPPort {
	return awsCNPPort{PortNumber: &awsCNPPortNumber{Protocol: proto, Port: port}}
}

func awsCNPRange(proto corev1.Protocol, start, end int32) awsCNPPort {
	return awsCNPPort{PortRange: &awsCNPPortRange{Protocol: proto, Start: start, End: end}}
}

func awsCNPNamed(name string) awsCNPPort { return awsCNPPort{NamedPort: &name} }

func awsANPOf(ns, name string, podSelector *metav1.LabelSelector, types []networkingv1.PolicyType,
	ingress []networkingv1.NetworkPolicyIngressRule, egress []awsANPEgress) awsANP {
	return awsANP{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.aws/v1alpha1", Kind: "ApplicationNetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       awsANPSpec{PodSelector: *podSelector, PolicyTypes: types, Ingress: ingress, Egress: egress},
	}
}
