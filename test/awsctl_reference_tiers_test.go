package test

import (
	"fmt"
	"net/netip"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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
