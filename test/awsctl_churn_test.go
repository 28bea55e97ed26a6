package test

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// awsChurnStep is a change of the world, made on the API server (and the
// node) as a user or a kubelet would, and the answers the author reads
// after it (checked against the reference like the static cases; every
// static case is judged again too).
type awsChurnStep struct {
	name   string
	change func(w *awsWorld)
	// reslice: stop the controller, delete every object it wrote, start
	// it again at the other chunk size (it writes them all again, cut in
	// slices of that size).
	reslice bool
	expect  []awsCase
}

func awsChurnSteps() []awsChurnStep {
	return []awsChurnStep{
		{
			name: "add pod shop/web-4 on this node (http=8082)",
			change: func(w *awsWorld) {
				w.Pods = append(w.Pods, awsPod{Namespace: "shop", Name: "web-4", IP: "10.0.0.14", Local: true,
					Labels: awsLabels("app", "web", "role", "front"), Ports: []corev1.ContainerPort{awsTCPPort("http", 8082)}})
			},
			expect: []awsCase{
				awsC("web-1", "in", "client", "tcp", 8082, "ALLOW namespace"), // the union grew
				awsC("web-4", "in", "client", "tcp", 8080, "ALLOW namespace"),
				awsC("web-4", "in", "client", "tcp", 80, "DENY namespace"),
				awsC("web-4", "out", "api", "tcp", 9090, "ALLOW namespace"),
				awsC("web-4", "out", awsOutside5, "tcp", 80, "DENY admin"),
				awsC("api", "out", "web-4", "tcp", 8082, "ALLOW admin"),
				awsC("api", "out", "web-4", "tcp", 8080, "ALLOW namespace"),
			},
		},
		{
			name:   "delete pod shop/web-2 (this node)",
			change: func(w *awsWorld) { w.removePod("shop/web-2") },
			expect: []awsCase{
				awsC("web-1", "in", "client", "tcp", 8081, "DENY namespace"), // the union shrank
				awsC("api", "in", "mon", "tcp", 8081, "DENY namespace"),      // and admin-tie's too
				awsC("web-1", "out", "10.0.0.12", "tcp", 8081, "DENY namespace"),
			},
		},
		{
			name:   "delete pod data/batch (other node)",
			change: func(w *awsWorld) { w.removePod("data/batch") },
			expect: []awsCase{
				awsC("api", "in", "10.0.1.21", "tcp", 80, "DENY namespace"),
			},
		},
		{
			name: "edit NetworkPolicy shop/api (endPort 8100 to 8090, except 10.0.1.192/26 to 10.0.1.224/27)",
			change: func(w *awsWorld) {
				np := w.networkPolicy("shop", "api")
				np.Spec.Egress[1] = networkingv1.NetworkPolicyEgressRule{
					To: awsFrom(awsPeerBlock("10.0.1.0/24", "10.0.1.224/27")), Ports: awsPorts(awsPort(awsUDP, 53), awsPort(awsTCP, 8000, 8090))}
			},
			expect: []awsCase{
				awsC("api", "out", awsExt130, "tcp", 8090, "ALLOW namespace"),
				awsC("api", "out", awsExt130, "tcp", 8100, "DENY namespace"),
				awsC("api", "out", awsExt200, "udp", 53, "ALLOW namespace"),
				awsC("api", "out", awsExt250, "udp", 53, "DENY namespace"),
			},
		},
		{
			name:   "edit ClusterNetworkPolicy admin-guard (priority 10 to 25: its Pass now after admin-lockdown's Deny)",
			change: func(w *awsWorld) { w.clusterNetworkPolicy("admin-guard").Spec.Priority = 25 },
			expect: []awsCase{
				awsC("cache", "out", "probe", "udp", 53, "DENY admin"),
				awsC("web-1", "out", awsExtPeer, "udp", 53, "DENY admin"),
				awsC("web-1", "in", "scraper", "tcp", 9090, "ALLOW admin"),
			},
		},
		{
			name:   "label namespace dev env=prod (admin-guard now selects its pods)",
			change: func(w *awsWorld) { w.Namespaces["dev"]["env"] = "prod" },
			expect: []awsCase{
				awsC("tool", "in", "probe", "tcp", 5432, "DENY admin"),
				awsC("sandbox", "in", "probe", "tcp", 5432, "DENY admin"),
				awsC("tool", "out", awsOutside5, "tcp", 80, "DENY admin"),
				awsC("tool", "out", awsOutside20, "tcp", 80, "ALLOW namespace"),
			},
		},
		{
			name:   "delete NetworkPolicy data/default-deny-egress",
			change: func(w *awsWorld) { w.removeNetworkPolicy("data", "default-deny-egress") },
			expect: []awsCase{
				awsC("db", "out", awsExtPeer, "tcp", 80, "ALLOW default"),
				awsC("db", "out", awsOutside20, "tcp", 82, "DENY baseline"),
				awsC("cache", "out", awsExtPeer, "tcp", 443, "DENY namespace"),
			},
		},
		{
			name:    "re-slice: the controller restarted at the other chunk size writes every object again",
			reslice: true,
		},
		{
			name: "edit ApplicationNetworkPolicy shop/api-app (ingress from client on 8080 to 8081) and ClusterNetworkPolicy baseline-deny (ingress Deny from dev on TCP 80 only)",
			change: func(w *awsWorld) {
				w.applicationNetworkPolicy("shop", "api-app").Spec.Ingress[0].Ports = awsPorts(awsPort(awsTCP, 8081))
				w.clusterNetworkPolicy("baseline-deny").Spec.Ingress[0].Ports = awsCNPPortList(awsCNPNum(awsTCP, 80))
			},
			expect: []awsCase{
				awsC("api", "in", "client", "tcp", 8080, "DENY namespace"),
				awsC("api", "in", "client", "tcp", 8081, "ALLOW namespace"),
				awsC("sandbox", "in", "probe", "tcp", 80, "DENY baseline"),
				awsC("sandbox", "in", "probe", "tcp", 81, "ALLOW default"),
			},
		},
	}
}

func (w *awsWorld) removePod(key string) {
	for i := range w.Pods {
		if w.Pods[i].key() == key {
			w.Pods = append(w.Pods[:i], w.Pods[i+1:]...)
			return
		}
	}
	panic("no pod " + key)
}

func (w *awsWorld) networkPolicy(ns, name string) *networkingv1.NetworkPolicy {
	for i := range w.NetworkPolicies {
		if np := &w.NetworkPolicies[i]; np.Namespace == ns && np.Name == name {
			return np
		}
	}
	panic("no NetworkPolicy " + ns + "/" + name)
}

func (w *awsWorld) removeNetworkPolicy(ns, name string) {
	for i := range w.NetworkPolicies {
		if np := &w.NetworkPolicies[i]; np.Namespace == ns && np.Name == name {
			w.NetworkPolicies = append(w.NetworkPolicies[:i], w.NetworkPolicies[i+1:]...)
			return
		}
	}
	panic("no NetworkPolicy " + ns + "/" + name)
}

func (w *awsWorld) applicationNetworkPolicy(ns, name string) *awsANP {
	for i := range w.ANPs {
		if a := &w.ANPs[i]; a.Namespace == ns && a.Name == name {
			return a
		}
	}
	panic("no ApplicationNetworkPolicy " + ns + "/" + name)
}

func (w *awsWorld) clusterNetworkPolicy(name string) *awsCNP {
	for i := range w.CNPs {
		if c := &w.CNPs[i]; c.Name == name {
			return c
		}
	}
	panic("no ClusterNetworkPolicy " + name)
}
