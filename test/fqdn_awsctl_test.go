package test

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/enimasq/enimasq/test/k8stest"
)

// The real AWS network policy controller v1.1.10 writes the objects of an
// ApplicationNetworkPolicy with domainNames (its PolicyEndpoints, a
// domainName entry without a cidr) and of a ClusterNetworkPolicy with a
// domainNames peer (a ClusterPolicyEndpoint's): the agent, reading them
// from the API server, redirects the selected pods' lookups to its proxy,
// and each pod reaches the names its entry allows on their first try after
// each lookup, and nothing else.
func TestPrivilegedPolicyFQDNFromAWSController(t *testing.T) {
	records := map[string][]string{"www.other.org": {"10.0.2.250"}}
	const rounds = 50
	for i := 1; i <= rounds; i++ {
		records[fmt.Sprintf("n%d.example.com", i)] = []string{fmt.Sprintf("10.0.2.%d", i)}
		records[fmt.Sprintf("n%d.corp.net", i)] = []string{fmt.Sprintf("10.0.2.%d", 100+i)}
	}
	node, _ := fqdnNode(t, records)
	const podC = "10.0.0.5"
	node.addPod("a", "enimfqdnca01", podA)
	node.addPod("c", "enimfqdncc01", podC)

	cluster := k8stest.Start(t)
	cluster.ForwardInto(t, node.ns[node.Node])
	k8stest.StartController(t, cluster, 200)
	cluster.MustApply(t,
		&unstructured.Unstructured{Object: map[string]any{"apiVersion": "cilium.io/v2", "kind": "CiliumNode", "metadata": map[string]any{"name": awsThisNode}, "spec": map[string]any{}}},
		&unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "fq", "labels": map[string]any{"team": "fq"}}}})
	cluster.RunningPod(t, "fq", "a", awsThisNode, podA, policyNodeIP, map[string]string{"app": "a"})
	cluster.RunningPod(t, "fq", "c", awsThisNode, podC, policyNodeIP, map[string]string{"app": "c"})

	dns := awsPorts(awsPort(awsUDP, 53), awsPort(awsTCP, 53))
	cSubject := awsCNPSubject{Pods: &awsNamespacedPod{NamespaceSelector: *awsSel("team", "fq"), PodSelector: *awsSel("app", "c")}}
	world := &awsWorld{
		ANPs: []awsANP{awsANPOf("fq", "a-names", awsSel("app", "a"), awsEgressOnly, nil, []awsANPEgress{
			{To: []awsANPPeer{{DomainNames: []string{"*.example.com"}}}, Ports: awsPorts(awsPort(awsTCP, fqdnPort))},
			{To: []awsANPPeer{{IPBlock: awsIPBlock(fqdnResolver + "/32")}}, Ports: dns},
		})},
		// Within one ClusterNetworkPolicy a Deny beats an Accept (one
		// priority): the deny-all is a policy of its own, after.
		CNPs: []awsCNP{
			awsCNPOf("c-names", "Admin", 10, cSubject, nil, []awsCNPEgress{
				{Action: "Accept", To: awsCNPPeers(awsCNPDomains("*.corp.net")), Ports: awsCNPPortList(awsCNPNum(awsTCP, fqdnPort))},
				{Action: "Accept", To: awsCNPPeers(awsCNPNetworks(fqdnResolver + "/32")), Ports: awsCNPPortList(awsCNPNum(awsUDP, 53), awsCNPNum(awsTCP, 53))},
			}),
			awsCNPOf("c-deny", "Admin", 20, cSubject, nil, []awsCNPEgress{
				{Action: "Deny", To: awsCNPPeers(awsCNPNetworks("0.0.0.0/0"))},
			}),
		},
	}
	var objs []*unstructured.Unstructured
	for _, o := range awsPolicyObjects(t, world) {
		objs = append(objs, o)
	}
	cluster.MustApply(t, objs...)

	a := NewAgent(t)
	a.NetNSName = node.Node
	a.Args = append(a.Args, "--k8s-kubeconfig-path", cluster.Kubeconfig, "--k8s-node-name", awsThisNode,
		"--enable-network-policy", "--enable-ipv6=false")
	a.Start()
	a.WaitHealthy()
	a.WaitFor("the controller's objects with their domain names", func() bool {
		pe := a.MustDbg("shell", "--", "db/show", "policy-endpoints")
		cpe := a.MustDbg("shell", "--", "db/show", "cluster-policy-endpoints")
		return strings.Contains(pe, "1 names") && strings.Contains(cpe, "1 names")
	})
	waitAttached(a, 2)

	for _, c := range []struct{ pod, name, ip string }{{"a", "n%d.example.com", "10.0.2.%d"}, {"c", "n%d.corp.net", "10.0.2.%d"}} {
		off := 0
		if c.pod == "c" {
			off = 100
		}
		if node.connect(node.podNS(c.pod), fmt.Sprintf(c.ip, off+1), fqdnPort) {
			t.Fatalf("pod %s reaches %s before any lookup", c.pod, fmt.Sprintf(c.ip, off+1))
		}
		for i := 1; i <= rounds; i++ {
			name, want := fmt.Sprintf(c.name, i), fmt.Sprintf(c.ip, off+i)
			ips, err := lookup(node, c.pod, "udp", name)
			if err != nil || len(ips) != 1 || ips[0].String() != want {
				t.Fatalf("pod %s: lookup %s: %v %v, want %s", c.pod, name, ips, err, want)
			}
			if !node.connect(node.podNS(c.pod), want, fqdnPort) {
				t.Fatalf("pod %s: %s (%s) not reached right after its lookup (round %d)", c.pod, name, want, i)
			}
		}
		if node.connect(node.podNS(c.pod), fmt.Sprintf(c.ip, off+1), fqdnOtherTCP) {
			t.Errorf("pod %s reaches its name on port %d, which its entry does not allow", c.pod, fqdnOtherTCP)
		}
		ips, err := lookup(node, c.pod, "udp", "www.other.org")
		if err != nil || len(ips) != 1 {
			t.Fatalf("pod %s: lookup www.other.org: %v %v", c.pod, ips, err)
		}
		if node.connect(node.podNS(c.pod), ips[0].String(), fqdnPort) {
			t.Errorf("pod %s reaches www.other.org, which its entry does not match", c.pod)
		}
	}
	// Each pod learnt only its own names.
	if out := a.MustDbg("policy", "fqdn", "--pod", podA); strings.Contains(out, "corp.net") || !strings.Contains(out, "example.com") {
		t.Errorf("pod a's names:\n%.2000s", out)
	}
	if out := a.MustDbg("policy", "fqdn", "--pod", podC); strings.Contains(out, "example.com") || !strings.Contains(out, "corp.net") {
		t.Errorf("pod c's names:\n%.2000s", out)
	}
}
