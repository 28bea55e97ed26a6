package test

// The reference evaluator of the AWS network policy controller suites: what
// the APIs say a packet gets, computed from the objects a user writes
// (Namespaces, Pods, NetworkPolicies, ApplicationNetworkPolicies and
// ClusterNetworkPolicies of networking.k8s.aws), never from the
// PolicyEndpoints the controller derives and never with enimasq's code
// (nothing under policymap/ is imported). The suites judge enimasq-agent's
// verdicts and real packets against it, so that a bug shared by the
// controller's output and enimasq's reading of it cannot hide.
//
// The order, for a packet of a pod on this node (a direction, a peer IP,
// a protocol and a destination port), as the AWS network policy agent
// v1.5.0 enforces it and DESIGN.md ("Network policy: one order") states:
//
//  0. The node's own IP is always allowed (kubelet probes).
//  1. Admin tier: of the rules of every Admin ClusterNetworkPolicy whose
//     subject selects the pod, those whose peer and ports match; the lowest
//     priority decides, at a tie Deny over Accept over Pass (across
//     policies, and within one: the rules of a policy are a set, not an
//     ordered list, in the AWS encoding). Deny denies, Accept allows, Pass
//     goes on to 2.
//  2. NetworkPolicy: the NetworkPolicies and ApplicationNetworkPolicies of
//     the pod's namespace that select it and whose policy types name the
//     direction isolate it there (policyTypes omitted: Ingress, and Egress
//     when the policy has egress rules, as the API server defaults it); an
//     isolated pod is allowed what some rule of one of them allows (rules
//     are a union; an ipBlock's except belongs to its peer), else denied.
//  3. Baseline tier, only when step 2 isolated nothing in the direction: as
//     step 1; Pass goes to 4.
//  4. The default: allow.
//
// Deliberate deviations from the Kubernetes semantics, each the limit of
// what the controller v1.1.10 can write (its objects carry resolved
// addresses and port numbers, not selectors), and what the AWS agent
// enforces as written; enimasq does the same:
//
//   - A named port of an ingress rule is resolved by the controller to the
//     union of that name's numbers over all the pods the policy selects, and
//     that union is written for each of them (web-1 http=8080 and web-2
//     http=8081: both are allowed 8080 and 8081). Kubernetes would allow each
//     pod its own number only. For a ClusterNetworkPolicy ingress rule the
//     union is over the subject's pods of its first namespace (sorted by
//     name).
//   - A named port of an egress rule is resolved per destination pod (as in
//     Kubernetes) for pod and namespace peers; towards an ipBlock or
//     networks peer, or a rule without peers, a named port matches nothing
//     (the controller drops it: there is no pod to resolve it on).
//   - FQDN peers (domainNames of an ApplicationNetworkPolicy or of a
//     ClusterNetworkPolicy) allow nothing: the controller writes them as
//     domainName entries without an address, which the AWS agent v1.5.0
//     skips and enimasq does too. An ApplicationNetworkPolicy that isolates
//     a pod's egress with only FQDN rules leaves it nothing but its node.
//   - An ApplicationNetworkPolicy egress rule without `to` allows nothing
//     (the controller drops a rule with no peer left); this file's scenario
//     does not use one.
//
// The scenario gives every ApplicationNetworkPolicy its policyTypes (the
// CRD has no default; the controller writes what is given).

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
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

// awsSelects says whether a label selector (empty: everything) matches.
func awsSelects(sel metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(&sel)
	if err != nil {
		panic(fmt.Sprintf("selector %v: %v", sel, err))
	}
	return s.Matches(labels.Set(l))
}

// podsSelected are the pods of namespace ns that sel selects.
func (w *awsWorld) podsSelected(ns string, sel metav1.LabelSelector) []*awsPod {
	var out []*awsPod
	for i := range w.Pods {
		if p := &w.Pods[i]; p.Namespace == ns && awsSelects(sel, p.Labels) {
			out = append(out, p)
		}
	}
	return out
}

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

// awsPeerKind is what a matching peer was: its kind decides how an egress
// named port resolves.
type awsPeerKind int

const (
	awsPeerAll     awsPeerKind = iota // a rule without peers
	awsPeerAddress                    // ipBlock, networks
	awsPeerPod                        // podSelector, namespaceSelector, pods, namespaces
)

// npPeerMatches says whether a NetworkPolicy peer (of a policy in
// namespace ns) holds ip.
func (w *awsWorld) npPeerMatches(ns string, peer networkingv1.NetworkPolicyPeer, ip netip.Addr) (bool, awsPeerKind) {
	if peer.IPBlock != nil {
		return awsInBlock(peer.IPBlock.CIDR, peer.IPBlock.Except, ip), awsPeerAddress
	}
	pod := w.podByIP(ip)
	if pod == nil {
		return false, awsPeerPod
	}
	if peer.NamespaceSelector == nil {
		if pod.Namespace != ns {
			return false, awsPeerPod
		}
	} else if !awsSelects(*peer.NamespaceSelector, w.nsLabels(pod.Namespace)) {
		return false, awsPeerPod
	}
	if peer.PodSelector != nil && !awsSelects(*peer.PodSelector, pod.Labels) {
		return false, awsPeerPod
	}
	return true, awsPeerPod
}

func awsInBlock(cidr string, except []string, ip netip.Addr) bool {
	if !netip.MustParsePrefix(cidr).Contains(ip) {
		return false
	}
	for _, e := range except {
		if netip.MustParsePrefix(e).Contains(ip) {
			return false
		}
	}
	return true
}

// awsNPRule is a NetworkPolicy or ApplicationNetworkPolicy rule in one
// direction, as the reference reads it.
type awsNPRule struct {
	peers []networkingv1.NetworkPolicyPeer
	// fqdnOnly: the rule's peers were all domain names (allows nothing).
	fqdnOnly bool
	ports    []awsRefPort
}

// awsNamespacePolicy is a NetworkPolicy or ApplicationNetworkPolicy: the
// pods it selects, the directions it isolates and its rules.
type awsNamespacePolicy struct {
	name     string // NetworkPolicy/ns/name, ApplicationNetworkPolicy/ns/name
	ns       string
	selector metav1.LabelSelector
	types    []networkingv1.PolicyType
	ingress  []awsNPRule
	egress   []awsNPRule
}

func (w *awsWorld) namespacePolicies() []awsNamespacePolicy {
	var out []awsNamespacePolicy
	for _, np := range w.NetworkPolicies {
		p := awsNamespacePolicy{name: "NetworkPolicy/" + np.Namespace + "/" + np.Name, ns: np.Namespace, selector: np.Spec.PodSelector,
			types: np.Spec.PolicyTypes}
		if len(p.types) == 0 { // the API server's default
			p.types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			if len(np.Spec.Egress) > 0 {
				p.types = append(p.types, networkingv1.PolicyTypeEgress)
			}
		}
		for _, r := range np.Spec.Ingress {
			p.ingress = append(p.ingress, awsNPRule{peers: r.From, ports: awsNPRefPorts(r.Ports)})
		}
		for _, r := range np.Spec.Egress {
			p.egress = append(p.egress, awsNPRule{peers: r.To, ports: awsNPRefPorts(r.Ports)})
		}
		out = append(out, p)
	}
	for _, anp := range w.ANPs {
		if len(anp.Spec.PolicyTypes) == 0 {
			panic(fmt.Sprintf("ApplicationNetworkPolicy %s/%s: the reference needs its policyTypes", anp.Namespace, anp.Name))
		}
		p := awsNamespacePolicy{name: "ApplicationNetworkPolicy/" + anp.Namespace + "/" + anp.Name, ns: anp.Namespace,
			selector: anp.Spec.PodSelector, types: anp.Spec.PolicyTypes}
		for _, r := range anp.Spec.Ingress {
			p.ingress = append(p.ingress, awsNPRule{peers: r.From, ports: awsNPRefPorts(r.Ports)})
		}
		for _, r := range anp.Spec.Egress {
			rule := awsNPRule{ports: awsNPRefPorts(r.Ports), fqdnOnly: true}
			for _, peer := range r.To {
				if len(peer.DomainNames) > 0 {
					continue // allows nothing
				}
				rule.fqdnOnly = false
				rule.peers = append(rule.peers, networkingv1.NetworkPolicyPeer{PodSelector: peer.PodSelector,
					NamespaceSelector: peer.NamespaceSelector, IPBlock: peer.IPBlock})
			}
			p.egress = append(p.egress, rule)
		}
		out = append(out, p)
	}
	return out
}

// allows says whether a rule of policy p allows the packet of pod.
func (w *awsWorld) allows(p awsNamespacePolicy, rule awsNPRule, q awsQuery, peer netip.Addr) (bool, string) {
	if rule.fqdnOnly {
		return false, ""
	}
	// Ingress: a name resolves over all the pods the policy selects (the
	// controller's union). Egress: on the destination pod, for pod peers.
	ingressNamed := func(name string, proto corev1.Protocol) []int32 {
		return awsNamedOn(w.podsSelected(p.ns, p.selector), name, proto)
	}
	egressNamed := func(name string, proto corev1.Protocol) []int32 {
		if dst := w.podByIP(peer); dst != nil {
			return awsNamedOn([]*awsPod{dst}, name, proto)
		}
		return nil
	}
	resolve := func(kind awsPeerKind) func(string, corev1.Protocol) []int32 {
		if q.Dir == "ingress" {
			return ingressNamed
		}
		if kind == awsPeerPod {
			return egressNamed
		}
		return nil
	}
	if len(rule.peers) == 0 {
		ok, ports := awsPortsMatch(rule.ports, q, resolve(awsPeerAll))
		return ok, "any peer, " + ports
	}
	for i, peer := range rule.peers {
		matched, kind := w.npPeerMatches(p.ns, peer, netip.MustParseAddr(q.Peer))
		if !matched {
			continue
		}
		if ok, ports := awsPortsMatch(rule.ports, q, resolve(kind)); ok {
			return true, fmt.Sprintf("peer %d, %s", i, ports)
		}
	}
	return false, ""
}

// cnpSubjectSelects says whether a ClusterNetworkPolicy's subject selects
// the pod.
func (w *awsWorld) cnpSubjectSelects(s awsCNPSubject, pod *awsPod) bool {
	switch {
	case s.Namespaces != nil:
		return awsSelects(*s.Namespaces, w.nsLabels(pod.Namespace))
	case s.Pods != nil:
		return awsSelects(s.Pods.NamespaceSelector, w.nsLabels(pod.Namespace)) && awsSelects(s.Pods.PodSelector, pod.Labels)
	}
	return false
}

// cnpPeerMatches says whether a ClusterNetworkPolicy peer holds ip (a
// domain name never does: FQDN allows nothing).
func (w *awsWorld) cnpPeerMatches(peer awsCNPPeer, ip netip.Addr) (bool, awsPeerKind) {
	switch {
	case len(peer.Networks) > 0:
		for _, n := range peer.Networks {
			if netip.MustParsePrefix(n).Contains(ip) {
				return true, awsPeerAddress
			}
		}
		return false, awsPeerAddress
	case len(peer.DomainNames) > 0:
		return false, awsPeerAddress
	}
	pod := w.podByIP(ip)
	if pod == nil {
		return false, awsPeerPod
	}
	if peer.Namespaces != nil {
		return awsSelects(*peer.Namespaces, w.nsLabels(pod.Namespace)), awsPeerPod
	}
	if peer.Pods != nil {
		return awsSelects(peer.Pods.NamespaceSelector, w.nsLabels(pod.Namespace)) && awsSelects(peer.Pods.PodSelector, pod.Labels), awsPeerPod
	}
	return false, awsPeerPod
}

// cnpSubjectFirstNamespacePods are the subject's pods of its first
// namespace by name: what the controller resolves an ingress named port
// on.
func (w *awsWorld) cnpSubjectFirstNamespacePods(s awsCNPSubject) []*awsPod {
	var nss []string
	for ns := range w.Namespaces {
		sel := metav1.LabelSelector{}
		if s.Namespaces != nil {
			sel = *s.Namespaces
		} else if s.Pods != nil {
			sel = s.Pods.NamespaceSelector
		}
		if awsSelects(sel, w.nsLabels(ns)) {
			nss = append(nss, ns)
		}
	}
	if len(nss) == 0 {
		return nil
	}
	sort.Strings(nss)
	podSel := metav1.LabelSelector{}
	if s.Pods != nil {
		podSel = s.Pods.PodSelector
	}
	return w.podsSelected(nss[0], podSel)
}

// awsTierHit is the best matching rule of a tier so far.
type awsTierHit struct {
	found    bool
	priority int32
	action   string
	why      string
}

var awsActionRank = map[string]int{"Deny": 0, "Accept": 1, "Pass": 2}

func (h awsTierHit) better(o awsTierHit) bool {
	return !o.found || h.priority < o.priority || h.priority == o.priority && awsActionRank[h.action] < awsActionRank[o.action]
}

// tier returns the deciding rule of a tier for the packet, if any.
func (w *awsWorld) tier(tier string, pod *awsPod, q awsQuery, peer netip.Addr) awsTierHit {
	var best awsTierHit
	for _, cnp := range w.CNPs {
		if cnp.Spec.Tier != tier || !w.cnpSubjectSelects(cnp.Spec.Subject, pod) {
			continue
		}
		type rule struct {
			action string
			peers  []awsCNPPeer
			ports  *[]awsCNPPort
		}
		var rules []rule
		if q.Dir == "ingress" {
			for _, r := range cnp.Spec.Ingress {
				rules = append(rules, rule{r.Action, r.From, r.Ports})
			}
		} else {
			for _, r := range cnp.Spec.Egress {
				rules = append(rules, rule{r.Action, r.To, r.Ports})
			}
		}
		for i, r := range rules {
			var ports []awsRefPort
			if r.ports != nil {
				ports = awsCNPRefPorts(*r.ports)
			}
			for _, cpeer := range r.peers {
				matched, kind := w.cnpPeerMatches(cpeer, peer)
				if !matched {
					continue
				}
				var resolve func(string, corev1.Protocol) []int32
				switch {
				case q.Dir == "ingress":
					resolve = func(name string, proto corev1.Protocol) []int32 {
						return awsNamedOn(w.cnpSubjectFirstNamespacePods(cnp.Spec.Subject), name, proto)
					}
				case kind == awsPeerPod:
					resolve = func(name string, proto corev1.Protocol) []int32 {
						return awsNamedOn([]*awsPod{w.podByIP(peer)}, name, proto)
					}
				}
				ok, why := awsPortsMatch(ports, q, resolve)
				if !ok {
					continue
				}
				hit := awsTierHit{found: true, priority: cnp.Spec.Priority, action: r.action,
					why: fmt.Sprintf("ClusterNetworkPolicy/%s (%s %d) %s rule %d %s, %s", cnp.Name, tier, cnp.Spec.Priority, q.Dir, i, r.action, why)}
				if hit.better(best) {
					best = hit
				}
			}
		}
	}
	return best
}

// Verdict is the reference's answer for a packet of a pod of this node.
func (w *awsWorld) Verdict(q awsQuery) (awsAnswer, error) {
	pod := w.pod(q.Pod)
	if pod == nil || !pod.Local {
		return awsAnswer{}, fmt.Errorf("%s is not a pod of this node", q.Pod)
	}
	if q.Dir != "ingress" && q.Dir != "egress" {
		return awsAnswer{}, fmt.Errorf("direction %q", q.Dir)
	}
	peer, err := netip.ParseAddr(q.Peer)
	if err != nil {
		return awsAnswer{}, err
	}
	// 0. The node.
	if peer == netip.MustParseAddr(w.NodeIP) {
		return awsAnswer{Allow: true, Step: "admin", Why: "the node IP"}, nil
	}
	// 1. Admin tier.
	if hit := w.tier("Admin", pod, q, peer); hit.found {
		switch hit.action {
		case "Deny":
			return awsAnswer{Allow: false, Step: "admin", Why: hit.why}, nil
		case "Accept":
			return awsAnswer{Allow: true, Step: "admin", Why: hit.why}, nil
		}
	}
	// 2. NetworkPolicy.
	dir := networkingv1.PolicyTypeIngress
	if q.Dir == "egress" {
		dir = networkingv1.PolicyTypeEgress
	}
	var isolating []string
	for _, p := range w.namespacePolicies() {
		if p.ns != pod.Namespace || !awsSelects(p.selector, pod.Labels) || !slices.Contains(p.types, dir) {
			continue
		}
		isolating = append(isolating, p.name)
		rules := p.ingress
		if q.Dir == "egress" {
			rules = p.egress
		}
		for i, r := range rules {
			if ok, why := w.allows(p, r, q, peer); ok {
				return awsAnswer{Allow: true, Step: "namespace", Why: fmt.Sprintf("%s %s rule %d, %s", p.name, q.Dir, i, why)}, nil
			}
		}
	}
	if len(isolating) > 0 {
		return awsAnswer{Allow: false, Step: "namespace", Why: "isolated by " + strings.Join(isolating, ", ") + "; no rule allows"}, nil
	}
	// 3. Baseline tier.
	if hit := w.tier("Baseline", pod, q, peer); hit.found {
		switch hit.action {
		case "Deny":
			return awsAnswer{Allow: false, Step: "baseline", Why: hit.why}, nil
		case "Accept":
			return awsAnswer{Allow: true, Step: "baseline", Why: hit.why}, nil
		}
		return awsAnswer{Allow: true, Step: "default", Why: "passed by " + hit.why}, nil
	}
	// 4. The default.
	return awsAnswer{Allow: true, Step: "default", Why: "no policy decides"}, nil
}
