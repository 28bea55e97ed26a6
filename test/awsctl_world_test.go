package test

import (
	"encoding/json"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// awsPod is a running, ready pod: on this node (its hostIP the policy
// node's IP, its netns behind a veth of the node) or on another node (its
// address answered by the peer netns).
type awsPod struct {
	Namespace string                 `json:"namespace"`
	Name      string                 `json:"name"`
	IP        string                 `json:"ip"`
	Local     bool                   `json:"local"`
	Labels    map[string]string      `json:"labels,omitempty"`
	Ports     []corev1.ContainerPort `json:"ports,omitempty"`
}

func (p *awsPod) key() string { return p.Namespace + "/" + p.Name }

// awsCNP is a ClusterNetworkPolicy of networking.k8s.aws/v1alpha1, the
// fields of the controller v1.1.10's api/v1alpha1 (its module is not a
// dependency of this one: the shape is repeated here, and the API server
// checks it against the controller's CRD with strict field validation).
type awsCNP struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              awsCNPSpec `json:"spec"`
}

type awsCNPSpec struct {
	Tier     string          `json:"tier"` // Admin, Baseline
	Priority int32           `json:"priority"`
	Subject  awsCNPSubject   `json:"subject"`
	Ingress  []awsCNPIngress `json:"ingress,omitempty"`
	Egress   []awsCNPEgress  `json:"egress,omitempty"`
}

type awsCNPSubject struct {
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods       *awsNamespacedPod     `json:"pods,omitempty"`
}

type awsNamespacedPod struct {
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`
	PodSelector       metav1.LabelSelector `json:"podSelector"`
}

type awsCNPIngress struct {
	Name   string        `json:"name,omitempty"`
	Action string        `json:"action"` // Accept, Deny, Pass
	From   []awsCNPPeer  `json:"from"`
	Ports  *[]awsCNPPort `json:"ports,omitempty"`
}

type awsCNPEgress struct {
	Name   string        `json:"name,omitempty"`
	Action string        `json:"action"`
	To     []awsCNPPeer  `json:"to"`
	Ports  *[]awsCNPPort `json:"ports,omitempty"`
}

// awsCNPPeer is an ingress peer (namespaces or pods) or an egress peer
// (also networks or domainNames); exactly one field is set.
type awsCNPPeer struct {
	Namespaces  *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods        *awsNamespacedPod     `json:"pods,omitempty"`
	Networks    []string              `json:"networks,omitempty"`
	DomainNames []string              `json:"domainNames,omitempty"`
}

type awsCNPPort struct {
	PortNumber *awsCNPPortNumber `json:"portNumber,omitempty"`
	PortRange  *awsCNPPortRange  `json:"portRange,omitempty"`
	NamedPort  *string           `json:"namedPort,omitempty"`
}

type awsCNPPortNumber struct {
	Protocol corev1.Protocol `json:"protocol"`
	Port     int32           `json:"port"`
}

type awsCNPPortRange struct {
	Protocol corev1.Protocol `json:"protocol"`
	Start    int32           `json:"start"`
	End      int32           `json:"end"`
}

// awsANP is an ApplicationNetworkPolicy of networking.k8s.aws/v1alpha1: a
// NetworkPolicy whose egress peers may also be domain names.
type awsANP struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              awsANPSpec `json:"spec"`
}

type awsANPSpec struct {
	PodSelector metav1.LabelSelector                    `json:"podSelector"`
	PolicyTypes []networkingv1.PolicyType               `json:"policyTypes,omitempty"`
	Ingress     []networkingv1.NetworkPolicyIngressRule `json:"ingress,omitempty"`
	Egress      []awsANPEgress                          `json:"egress,omitempty"`
}

type awsANPEgress struct {
	Ports []networkingv1.NetworkPolicyPort `json:"ports,omitempty"`
	To    []awsANPPeer                     `json:"to,omitempty"`
}

type awsANPPeer struct {
	PodSelector       *metav1.LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	IPBlock           *networkingv1.IPBlock `json:"ipBlock,omitempty"`
	DomainNames       []string              `json:"domainNames,omitempty"`
}

// awsWorld is everything the reference judges by: what the API server
// holds (apart from what the API server itself makes, which selects or
// holds no pod here).
type awsWorld struct {
	NodeIP string `json:"nodeIP"`
	// Namespaces are the namespaces' own labels; the API server adds
	// kubernetes.io/metadata.name, and so does nsLabels.
	Namespaces      map[string]map[string]string `json:"namespaces"`
	Pods            []awsPod                     `json:"pods"`
	NetworkPolicies []networkingv1.NetworkPolicy `json:"networkPolicies"`
	ANPs            []awsANP                     `json:"anps"`
	CNPs            []awsCNP                     `json:"cnps"`
}

// clone is a deep copy.
func (w *awsWorld) clone() *awsWorld {
	data, err := json.Marshal(w)
	if err != nil {
		panic(err)
	}
	var out awsWorld
	if err := json.Unmarshal(data, &out); err != nil {
		panic(err)
	}
	return &out
}

// awsQuery is one packet: a pod of this node (namespace/name), the
// direction, the peer's IP, the protocol (tcp, udp, sctp) and the
// destination port.
type awsQuery struct {
	Pod   string
	Dir   string // ingress, egress
	Peer  string
	Proto string
	Port  int32
}

// awsAnswer is a verdict: allow or deny, the step that decided (admin,
// namespace, baseline, default, as enimasq-dbg names them; the node IP is
// the admin step's) and why, for the reader.
type awsAnswer struct {
	Allow bool
	Step  string
	Why   string
}

func (a awsAnswer) String() string {
	if a.Allow {
		return "ALLOW " + a.Step
	}
	return "DENY " + a.Step
}

func (w *awsWorld) pod(key string) *awsPod {
	for i := range w.Pods {
		if w.Pods[i].key() == key {
			return &w.Pods[i]
		}
	}
	return nil
}

func (w *awsWorld) podByIP(ip netip.Addr) *awsPod {
	for i := range w.Pods {
		if a, err := netip.ParseAddr(w.Pods[i].IP); err == nil && a == ip {
			return &w.Pods[i]
		}
	}
	return nil
}

// nsLabels are a namespace's labels as the API server has them.
func (w *awsWorld) nsLabels(ns string) labels.Set {
	out := labels.Set{"kubernetes.io/metadata.name": ns}
	for k, v := range w.Namespaces[ns] {
		out[k] = v
	}
	return out
}
