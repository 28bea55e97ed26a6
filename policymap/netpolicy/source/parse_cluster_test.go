package source

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// clusterMinimal is a valid ClusterPolicyEndpoint with spec lines to be
// appended.
func clusterMinimal(spec string) string {
	return "apiVersion: networking.k8s.aws/v1alpha1\nkind: ClusterPolicyEndpoint\nmetadata: {name: c}\nspec:\n  policyRef: {name: cnp}\n  tier: Admin\n  priority: 10\n" + spec
}

func TestParseClusterPolicyEndpoint(t *testing.T) {
	data := clusterMinimal(`  podSelectorEndpoints:
  - {hostIP: 10.0.0.1, podIP: 10.0.0.5, name: web-0, namespace: shop}
  - {hostIP: 'fd00::1', podIP: 'fd00::5', name: web-0, namespace: shop}
  ingress:
  - {cidr: 10.1.0.0/16, action: Deny}
  - {cidr: 'fd00::/8', ports: [{port: 80}, {protocol: UDP, port: 53, endPort: 54}], action: Accept}
  egress:
  - {cidr: 10.2.3.4, ports: [{protocol: SCTP}], action: Pass}
`)
	cpes, err := ParseClusterPolicyEndpoints("f.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	want := []*ClusterPolicyEndpoint{{
		Name: "c", File: "f.yaml", PolicyRef: "cnp", Tier: endpoints.TierAdmin, Priority: 10,
		Pods: []PodEndpoint{
			{Name: "web-0", Namespace: "shop", PodIP: a("10.0.0.5"), HostIP: a("10.0.0.1")},
			{Name: "web-0", Namespace: "shop", PodIP: a("fd00::5"), HostIP: a("fd00::1")},
		},
		Ingress: []ClusterRule{
			{CIDR: p("10.1.0.0/16"), Action: endpoints.ActionDeny},
			{CIDR: p("fd00::/8"), Ports: []Port{{Protocol: policybpf.ProtocolTCP, Port: 80}, {Protocol: policybpf.ProtocolUDP, Port: 53, EndPort: 54}}, Action: endpoints.ActionAccept},
		},
		Egress: []ClusterRule{{CIDR: p("10.2.3.4/32"), Ports: []Port{{Protocol: policybpf.ProtocolSCTP}}, Action: endpoints.ActionPass}},
	}}
	if !reflect.DeepEqual(cpes, want) {
		t.Errorf("parsed\n%+v\nwant\n%+v", cpes[0], want[0])
	}
	// The same file's PolicyEndpoints: none.
	if pes, err := ParsePolicyEndpoints("f.yaml", []byte(data)); err != nil || len(pes) != 0 {
		t.Errorf("PolicyEndpoints of a ClusterPolicyEndpoint file: %v %v", pes, err)
	}
}

// TestParseBothKinds: each document, and each item of a List, goes to the
// table of its kind; a typed list's items are of its kind.
func TestParseBothKinds(t *testing.T) {
	data := minimal("") + "---\n" + clusterMinimal("") + "---\n" +
		"apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(strings.ReplaceAll(clusterMinimal(""), "name: c}", "name: c2}"), "\n", "\n  ") +
		"\n- " + strings.ReplaceAll(strings.ReplaceAll(minimal(""), "name: p,", "name: p2,"), "\n", "\n  ") + "\n---\n" +
		"apiVersion: networking.k8s.aws/v1alpha1\nkind: ClusterPolicyEndpointList\nitems:\n- " + strings.ReplaceAll(strings.ReplaceAll(clusterMinimal(""), "name: c}", "name: c3}"), "\n", "\n  ")
	pes, err := ParsePolicyEndpoints("f.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	cpes, err := ParseClusterPolicyEndpoints("f.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, pe := range pes {
		names = append(names, pe.Key())
	}
	for _, cpe := range cpes {
		names = append(names, cpe.Key())
	}
	if !slices.Equal(names, []string{"ns/p", "ns/p2", "c", "c2", "c3"}) {
		t.Errorf("objects %v", names)
	}
	// The same name in both kinds is two objects; twice in one kind is an
	// error.
	if _, err := ParseClusterPolicyEndpoints("f.yaml", []byte(strings.ReplaceAll(minimal(""), "name: p,", "name: c,")+"---\n"+clusterMinimal(""))); err != nil {
		t.Errorf("a PolicyEndpoint and a ClusterPolicyEndpoint of one name: %v", err)
	}
	_, err = ParseClusterPolicyEndpoints("f.yaml", []byte(clusterMinimal("")+"---\n"+clusterMinimal("")))
	if err == nil || !strings.Contains(err.Error(), "f.yaml: document 2: ClusterPolicyEndpoint c is defined twice (first in f.yaml: document 1)") {
		t.Errorf("twice: %v", err)
	}
}

func TestParseClusterErrorsNameFileFieldAndValue(t *testing.T) {
	header := "apiVersion: networking.k8s.aws/v1alpha1\nkind: ClusterPolicyEndpoint\nmetadata: {name: c}\n"
	for _, tc := range []struct {
		name, file, want string
	}{
		{"no spec", header, "f.yaml: c: field spec is missing"},
		{"no policyRef", header + "spec: {tier: Admin, priority: 1}", "f.yaml: c: field spec.policyRef is missing"},
		{"policyRef name", header + "spec: {policyRef: {name: a/b}, tier: Admin, priority: 1}", `field spec.policyRef.name: value "a/b" is not an object name`},
		{"no tier", header + "spec: {policyRef: {name: a}, priority: 1}", "c: field spec.tier is missing"},
		{"tier", header + "spec: {policyRef: {name: a}, tier: Developer, priority: 1}", `c: field spec.tier: value "Developer" is not Admin or Baseline`},
		{"tier case", header + "spec: {policyRef: {name: a}, tier: baseline, priority: 1}", `field spec.tier: value "baseline" is not Admin or Baseline`},
		{"no priority", header + "spec: {policyRef: {name: a}, tier: Admin}", "c: field spec.priority is missing: want an integer 0..1000"},
		{"priority high", clusterMinimal("")[:len(clusterMinimal(""))-len("  priority: 10\n")] + "  priority: 1001\n", "c: field spec.priority: value 1001 is outside 0..1000"},
		{"priority negative", header + "spec: {policyRef: {name: a}, tier: Admin, priority: -5}", "field spec.priority: value -5 is outside 0..1000"},
		{"priority past int32", header + "spec: {policyRef: {name: a}, tier: Admin, priority: 4294967297}", "field spec.priority: value 4294967297 is outside 0..1000"},
		{"priority float", header + "spec: {policyRef: {name: a}, tier: Admin, priority: 1.5}", "field spec.priority: value 1.5 is not an integer"},
		{"priority string", header + "spec: {policyRef: {name: a}, tier: Admin, priority: '1'}", `field spec.priority: value "1" is not an integer`},
		{"no action", clusterMinimal("  ingress: [{cidr: 10.0.0.0/8, action: Deny}, {cidr: 10.0.0.0/8}]\n"), "c: field spec.ingress[1].action is missing"},
		{"action", clusterMinimal("  egress: [{cidr: 10.0.0.0/8, action: Allow}]\n"), `c: field spec.egress[0].action: value "Allow" is not Accept, Deny or Pass`},
		{"action case", clusterMinimal("  egress: [{cidr: 10.0.0.0/8, action: deny}]\n"), `field spec.egress[0].action: value "deny" is not Accept, Deny or Pass`},
		{"action of a skipped entry", clusterMinimal("  egress: [{domainName: example.com, action: Drop}]\n"), `field spec.egress[0].action: value "Drop" is not Accept, Deny or Pass`},
		{"cidr", clusterMinimal("  egress: [{cidr: 10.0.0.0/33, action: Deny}]\n"), `field spec.egress[0].cidr: value "10.0.0.0/33" is not a CIDR`},
		{"mapped cidr", clusterMinimal("  egress: [{cidr: '::ffff:10.0.0.0/104', action: Deny}]\n"), `is an IPv4-mapped IPv6 prefix`},
		{"ingress without cidr", clusterMinimal("  ingress: [{ports: [{port: 80}], action: Deny}]\n"), "field spec.ingress[0].cidr is missing"},
		{"a Deny of names", clusterMinimal("  egress: [{domainName: example.com, action: Deny}]\n"), `field spec.egress[0].action: value "Deny" is not allowed on a domainName entry, which may Accept or Pass only`},
		{"not a domain name", clusterMinimal("  egress: [{domainName: 'ex ample.com', action: Accept}]\n"), `field spec.egress[0].domainName: value "ex ample.com" is not a domain name`},
		{"ingress domainName", clusterMinimal("  ingress: [{cidr: 10.0.0.0/8, domainName: example.com, action: Deny}]\n"), `field spec.ingress[0].domainName: value "example.com" is for egress rules only`},
		{"protocol", clusterMinimal("  egress: [{cidr: 10.0.0.0/8, ports: [{protocol: ICMP}], action: Deny}]\n"), `field spec.egress[0].ports[0].protocol: value "ICMP" is not TCP, UDP or SCTP`},
		{"port", clusterMinimal("  egress: [{cidr: 10.0.0.0/8, ports: [{port: 65536}], action: Deny}]\n"), `field spec.egress[0].ports[0].port: value 65536 is outside 1..65535`},
		{"endPort below", clusterMinimal("  egress: [{cidr: 10.0.0.0/8, ports: [{port: 90, endPort: 80}], action: Deny}]\n"), `field spec.egress[0].ports[0].endPort: value 80 is below port 90`},
		{"endPort alone", clusterMinimal("  egress: [{cidr: 10.0.0.0/8, ports: [{endPort: 80}], action: Deny}]\n"), `field spec.egress[0].ports[0].endPort: value 80 needs a port`},
		{"pod ip", clusterMinimal("  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: x}]\n"), `field spec.podSelectorEndpoints[0].podIP: value "x" is not an IP address`},
		{"wrong kind in a typed list", "apiVersion: v1\nkind: ClusterPolicyEndpointList\nitems: [{apiVersion: networking.k8s.aws/v1alpha1, kind: PolicyEndpoint, metadata: {name: c}}]",
			`f.yaml: field items[0].kind: value "PolicyEndpoint" is not ClusterPolicyEndpoint`},
		{"list item", "apiVersion: v1\nkind: List\nitems: [{apiVersion: networking.k8s.aws/v1alpha1, kind: ClusterPolicyEndpoint, metadata: {name: c}, spec: {policyRef: {name: a}, tier: Admin, priority: 1, egress: [{cidr: x, action: Deny}]}}]",
			`f.yaml: c: field items[0].spec.egress[0].cidr: value "x" is not a CIDR`},
		{"api version", strings.Replace(clusterMinimal(""), "v1alpha1", "v1", 1), `f.yaml: field apiVersion: value "networking.k8s.aws/v1" is not networking.k8s.aws/v1alpha1`},
		{"no name", "apiVersion: networking.k8s.aws/v1alpha1\nkind: ClusterPolicyEndpoint\nmetadata: {}\nspec: {}", "f.yaml: field metadata.name is missing"},
		{"name with #", strings.Replace(clusterMinimal(""), "name: c}", "name: 'c#1'}", 1), `field metadata.name: value "c#1" is not an object name (no '#')`},
		{"too many rules", clusterMinimal("  egress:\n" + strings.Repeat("  - {cidr: 10.0.0.0/8, action: Deny}\n", MaxPolicyEndpointRules+1)),
			fmt.Sprintf("c: field spec: %d rules (ingress and egress), a ClusterPolicyEndpoint may have at most %d", MaxPolicyEndpointRules+1, MaxPolicyEndpointRules)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cpes, err := ParseClusterPolicyEndpoints("f.yaml", []byte(tc.file))
			if err == nil {
				t.Fatalf("accepted: %+v", cpes)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tc.want)
			}
		})
	}
}

func TestParseClusterWarnings(t *testing.T) {
	for _, tc := range []struct {
		name, spec string
		want       []string
		egress     int
	}{
		{"host bits", "  egress: [{cidr: 10.1.2.3/8, action: Deny}]\n", []string{`spec.egress[0].cidr: "10.1.2.3/8" has host bits set: using 10.0.0.0/8`}, 1},
		{"domainName without a cidr: a name rule", "  egress: [{domainName: '*.Example.com.', ports: [{port: 443}], action: Accept}]\n", nil, 0},
		{"domainName and cidr", "  egress: [{cidr: 10.0.0.0/8, domainName: example.com, action: Accept}]\n",
			[]string{`spec.egress[0].domainName: "example.com" is not enforced: the entry's cidr 10.0.0.0/8 is`}, 1},
		{"neither", "  egress: [{action: Pass}]\n", []string{"spec.egress[0]: no cidr: skipped, its Pass applies to nothing (the AWS agent skips the entry)"}, 0},
		{"duplicate pod", "  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}, {hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n",
			[]string{"spec.podSelectorEndpoints[1]: podIP 10.0.0.5 is listed twice (also spec.podSelectorEndpoints[0]): the first is used"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cpes, err := ParseClusterPolicyEndpoints("f.yaml", []byte(clusterMinimal(tc.spec)))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cpes[0].Warnings, tc.want) || len(cpes[0].Egress) != tc.egress {
				t.Errorf("warnings\n%q\nwant\n%q; %d egress rules, want %d", cpes[0].Warnings, tc.want, len(cpes[0].Egress), tc.egress)
			}
		})
	}
	cpes, err := ParseClusterPolicyEndpoints("f.yaml", []byte(strings.Replace(clusterMinimal(""), "name: c}", "name: c, namespace: default}", 1)))
	if err != nil || !slices.Equal(cpes[0].Warnings, []string{`metadata.namespace: "default" ignored: a ClusterPolicyEndpoint is cluster-scoped`}) {
		t.Errorf("namespace: %v %v", cpes, err)
	}
}

// TestClusterStandIns: what an invalid ClusterPolicyEndpoint without a last
// good version puts in force, by what can be read of it: always the top of
// the Admin tier, no rules.
func TestClusterStandIns(t *testing.T) {
	for _, tc := range []struct {
		name, file, key, pods, invalid string
	}{
		{"bad value", clusterMinimal("  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  egress: [{cidr: 10.0.0.0/33, action: Deny}]\n"),
			"c", "10.0.0.5", `field spec.egress[0].cidr: value "10.0.0.0/33" is not a CIDR`},
		{"one bad pod IP", clusterMinimal("  podSelectorEndpoints: [{podIP: 10.0.0.300}, {podIP: 10.0.0.6}]\n"), "c", "10.0.0.6", "is not an IP address"},
		{"pods not a list", clusterMinimal("  podSelectorEndpoints: {podIP: 10.0.0.7}\n"), "c", "10.0.0.7", "is not a list"},
		{"not YAML", "kind: ClusterPolicyEndpoint\nmetadata: {name: c\nspec:\n  podSelectorEndpoints:\n  - podIP: 10.0.0.8\n", "f.yaml#1", "10.0.0.8", "not valid YAML or JSON"},
		{"bad name", strings.Replace(clusterMinimal("  podSelectorEndpoints: [{podIP: 10.0.0.9}]\n"), "name: c}", "name: 'c#2'}", 1), "f.yaml#1", "10.0.0.9", "is not an object name"},
		{"list item", "apiVersion: v1\nkind: List\nitems:\n- {kind: ClusterPolicyEndpoint, metadata: {name: a}, spec: {podSelectorEndpoints: [{podIP: 10.0.0.10}]}}",
			"a", "10.0.0.10", "field items[0].apiVersion"},
		{"typed list item", "apiVersion: v1\nkind: ClusterPolicyEndpointList\nitems:\n- {metadata: {}, spec: {podSelectorEndpoints: [{podIP: 10.0.0.11}]}}",
			"f.yaml#1.items[0]", "10.0.0.11", "field items[0].apiVersion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := parsePolicyFile("f.yaml", []byte(tc.file))
			if err == nil || len(objs) != 1 || rowOf[*ClusterPolicyEndpoint](objs[0]) == nil || objs[0].err == nil {
				t.Fatalf("want one invalid ClusterPolicyEndpoint, got %+v, %v", objs, err)
			}
			cpe := clusterPolicyEndpoints.resolve(objs, nil)[0]
			var pods []string
			for _, p := range cpe.Pods {
				pods = append(pods, p.PodIP.String())
			}
			if cpe.Key() != tc.key || strings.Join(pods, ",") != tc.pods || !cpe.StandIn || cpe.Tier != endpoints.TierAdmin || cpe.Priority != 0 ||
				len(cpe.Ingress)+len(cpe.Egress) != 0 || !strings.Contains(cpe.Invalid, tc.invalid) {
				t.Errorf("stand-in %+v\nwant %s %s, Admin 0, no rules, %q", cpe, tc.key, tc.pods, tc.invalid)
			}
		})
	}
}

// TestResolveClusters: an invalid object keeps its last good version; a
// document whose name or kind cannot be read keeps every last good object
// of the file; a valid object of a file in error applies.
func TestResolveClusters(t *testing.T) {
	second := strings.ReplaceAll(clusterMinimal("  podSelectorEndpoints: [{podIP: 10.0.0.6}]\n"), "name: c}", "name: d}")
	good, err := ParseClusterPolicyEndpoints("f.yaml", []byte(clusterMinimal("  egress: [{cidr: 10.0.0.0/8, action: Deny}]\n")+"---\n"+second))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parsePolicyFile("f.yaml", []byte(clusterMinimal("  egress: [{cidr: 10.0.0.0/33, action: Deny}]\n")+"---\n"+
		strings.ReplaceAll(second, "10.0.0.6", "10.0.0.7")))
	if err == nil {
		t.Fatal("accepted")
	}
	out := clusterPolicyEndpoints.resolve(objs, good)
	if len(out) != 2 || out[0].Key() != "c" || len(out[0].Egress) != 1 || out[0].Invalid == "" || out[0].StandIn ||
		out[1].Key() != "d" || out[1].Pods[0].PodIP.String() != "10.0.0.7" || out[1].Invalid != "" {
		t.Errorf("resolved %+v", out)
	}
	for _, doc := range []string{"kind: ClusterPolicyEndpoint\nmetadata: [\n", "apiVersion: v1\nkind: Foo\n"} {
		objs, _ = parsePolicyFile("f.yaml", []byte(doc))
		out = clusterPolicyEndpoints.resolve(objs, good)
		var keys []string
		for _, cpe := range out {
			keys = append(keys, cpe.Key())
		}
		if len(out) < 2 || !slices.Contains(keys, "c") || !slices.Contains(keys, "d") {
			t.Errorf("%q: %v %+v", doc, keys, out)
		}
	}
}

// TestForNode: an IPv4-only node drops the IPv6 pod IPs and rules of a
// row, each with a warning, and leaves a row without any as it is.
func TestForNode(t *testing.T) {
	cpes, err := ParseClusterPolicyEndpoints("f.yaml", []byte(clusterMinimal("  podSelectorEndpoints: [{podIP: 10.0.0.5}, {podIP: 'fd00::5'}]\n  ingress: [{cidr: '::/0', action: Deny}, {cidr: 0.0.0.0/0, action: Accept}]\n")))
	if err != nil {
		t.Fatal(err)
	}
	v4 := forNode(cpes[0], nodeconfig.Config{EnableIPv4: true})
	if len(v4.Pods) != 1 || len(v4.Ingress) != 1 || v4.Ingress[0].Action != endpoints.ActionAccept || len(v4.Warnings) != len(cpes[0].Warnings)+2 ||
		len(cpes[0].Pods) != 2 || len(cpes[0].Ingress) != 2 {
		t.Errorf("v4 node: %+v (original %+v)", v4, cpes[0])
	}
	if dual := forNode(cpes[0], nodeconfig.Config{EnableIPv4: true, EnableIPv6: true}); dual != cpes[0] {
		t.Errorf("dual-stack node: %+v", dual)
	}
}

func TestClusterPodsOnNode(t *testing.T) {
	a := netip.MustParseAddr
	cpe := &ClusterPolicyEndpoint{Name: "c", Pods: []PodEndpoint{
		{PodIP: a("10.0.1.1"), HostIP: a("10.0.0.1")},
		{PodIP: a("10.0.2.1"), HostIP: a("10.0.0.2")},
		{PodIP: a("10.0.3.1")},
	}}
	if got := podsOnNode(cpe, map[netip.Addr]bool{a("10.0.0.9"): true}); got != nil {
		t.Errorf("no pod of this node: %v", got)
	}
	if got := podsOnNode(cpe, map[netip.Addr]bool{a("10.0.0.2"): true}); got == nil || len(got.Pods) != 1 || got.Pods[0].PodIP != a("10.0.2.1") || len(cpe.Pods) != 3 {
		t.Errorf("one pod of this node: %v", got)
	}
	stand := *cpe
	stand.StandIn = true
	if got := podsOnNode(&stand, map[netip.Addr]bool{a("10.0.0.2"): true}); got == nil || len(got.Pods) != 2 {
		t.Errorf("a stand-in keeps the pods without a hostIP: %v", got)
	}
}

// encodeClusterPolicyEndpoints writes objects back as a
// ClusterPolicyEndpointList in JSON, the way the controller would.
func encodeClusterPolicyEndpoints(cpes []*ClusterPolicyEndpoint) ([]byte, error) {
	type port struct {
		Protocol string `json:"protocol"`
		Port     uint16 `json:"port,omitempty"`
		EndPort  uint16 `json:"endPort,omitempty"`
	}
	type rule struct {
		CIDR       string `json:"cidr,omitempty"`
		DomainName string `json:"domainName,omitempty"`
		Ports      []port `json:"ports,omitempty"`
		Action     string `json:"action"`
	}
	type pod struct {
		HostIP    string `json:"hostIP,omitempty"`
		PodIP     string `json:"podIP"`
		Name      string `json:"name,omitempty"`
		Namespace string `json:"namespace,omitempty"`
	}
	protoName := map[uint32]string{policybpf.ProtocolTCP: "TCP", policybpf.ProtocolUDP: "UDP", policybpf.ProtocolSCTP: "SCTP"}
	rules := func(rs []ClusterRule) []rule {
		var out []rule
		for _, r := range rs {
			o := rule{CIDR: r.CIDR.String(), Action: string(r.Action)}
			for _, p := range r.Ports {
				o.Ports = append(o.Ports, port{protoName[p.Protocol], p.Port, p.EndPort})
			}
			out = append(out, o)
		}
		return out
	}
	names := func(ns []endpoints.NameRule) []rule {
		var out []rule
		for _, n := range ns {
			o := rule{DomainName: n.Pattern, Action: string(n.Action)}
			for _, p := range n.Ports {
				o.Ports = append(o.Ports, port{protoName[p.Protocol], p.Port, p.EndPort})
			}
			out = append(out, o)
		}
		return out
	}
	var items []any
	for _, cpe := range cpes {
		var pods []pod
		for _, p := range cpe.Pods {
			o := pod{PodIP: p.PodIP.String(), Name: p.Name, Namespace: p.Namespace}
			if p.HostIP.IsValid() {
				o.HostIP = p.HostIP.String()
			}
			pods = append(pods, o)
		}
		items = append(items, map[string]any{
			"apiVersion": PolicyEndpointAPIVersion,
			"kind":       ClusterPolicyEndpointKind,
			"metadata":   map[string]string{"name": cpe.Name},
			"spec": map[string]any{
				"policyRef":            map[string]string{"name": cpe.PolicyRef},
				"tier":                 cpe.Tier,
				"priority":             cpe.Priority,
				"podSelectorEndpoints": pods,
				"ingress":              rules(cpe.Ingress),
				"egress":               append(rules(cpe.Egress), names(cpe.EgressNames)...),
			},
		})
	}
	return json.Marshal(map[string]any{"apiVersion": PolicyEndpointAPIVersion, "kind": clusterPolicyEndpointListKind, "items": items})
}

// FuzzParseClusterPolicyEndpoints: no input panics or is accepted beyond the
// limits or with a field out of its range, and an accepted file, written
// back out and parsed again, gives the same objects. The corpus is
// testdata/fuzz/FuzzParseClusterPolicyEndpoints and the seeds here.
func FuzzParseClusterPolicyEndpoints(f *testing.F) {
	for _, seed := range []string{
		"", "---", clusterMinimal(""),
		clusterMinimal("  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}, {hostIP: 'fd00::1', podIP: 'fd00::5'}]\n  ingress: [{cidr: '::/0', action: Deny}]\n"),
		clusterMinimal("  egress: [{cidr: 10.1.2.3/8, ports: [{port: 80, endPort: 90}, {protocol: UDP}], action: Pass}, {domainName: example.com, action: Accept}]\n"),
		minimal("") + "---\n" + clusterMinimal(""),
		`{"apiVersion":"v1","kind":"List","items":[{"kind":"ClusterPolicyEndpoint"}]}`, "apiVersion: v1\nkind: ClusterPolicyEndpointList\nitems: [{}]",
		"kind: ClusterPolicyEndpoint\nmetadata: [", "a: [",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cpes, err := ParseClusterPolicyEndpoints("fuzz", data)
		if err != nil {
			// An invalid file still gives stand-ins that open nothing.
			objs, _ := parsePolicyFile("fuzz", data)
			for _, cpe := range clusterPolicyEndpoints.resolve(objs, nil) {
				if cpe.Invalid != "" && (!cpe.StandIn || len(cpe.Ingress)+len(cpe.Egress) != 0 || cpe.Tier != endpoints.TierAdmin || cpe.Priority != 0) {
					t.Fatalf("stand-in %+v", cpe)
				}
			}
			return
		}
		for _, cpe := range cpes {
			if cpe.Tier != endpoints.TierAdmin && cpe.Tier != endpoints.TierBaseline || cpe.Priority < 0 || cpe.Priority > endpoints.MaxClusterPriority ||
				cpe.Name == "" || strings.Contains(cpe.Name, "#") || cpe.StandIn || cpe.Invalid != "" {
				t.Fatalf("accepted %+v", cpe)
			}
			for _, r := range slices.Concat(cpe.Ingress, cpe.Egress) {
				if r.CIDR.Masked() != r.CIDR || r.CIDR.Addr().Is4In6() || !slices.Contains(actions, string(r.Action)) {
					t.Fatalf("rule %+v accepted as is", r)
				}
				for _, p := range r.Ports {
					if p.EndPort != 0 && p.EndPort <= p.Port {
						t.Fatalf("port range %d-%d", p.Port, p.EndPort)
					}
				}
			}
		}
		out, err := encodeClusterPolicyEndpoints(cpes)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseClusterPolicyEndpoints("fuzz", out)
		if err != nil {
			t.Fatalf("re-parse of %s: %s", out, err)
		}
		strip := func(cs []*ClusterPolicyEndpoint) []ClusterPolicyEndpoint {
			out := make([]ClusterPolicyEndpoint, len(cs))
			for i, c := range cs {
				out[i] = *c
				out[i].Warnings = nil
			}
			return out
		}
		if !reflect.DeepEqual(strip(cpes), strip(again)) {
			t.Fatalf("round trip changed objects:\n%+v\n%+v", strip(cpes), strip(again))
		}
	})
}
