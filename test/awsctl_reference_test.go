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
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

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
