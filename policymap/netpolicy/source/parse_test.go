package source

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/compile"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

const samplePath = "../../../test/testdata/samples/policyendpoint-v6-except.yaml"

func TestParseSample(t *testing.T) {
	data, err := os.ReadFile(samplePath)
	if err != nil {
		t.Fatal(err)
	}
	pes, err := ParsePolicyEndpoints("sample.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if len(pes) != 1 {
		t.Fatalf("%d objects", len(pes))
	}
	pe := pes[0]
	want := &PolicyEndpoint{
		Namespace:      "shop",
		Name:           "web-egress-x7k2p",
		File:           "sample.yaml",
		PolicyRef:      "shop/web-egress",
		IsolatesEgress: true,
		Pods: []PodEndpoint{{Name: "web-7d9f8c6b5-abcde", Namespace: "shop",
			PodIP: netip.MustParseAddr("10.130.100.133"), HostIP: netip.MustParseAddr("10.130.0.10")}},
		Egress: []Rule{
			{CIDR: netip.MustParsePrefix("10.130.112.20/32"), Ports: []Port{{Protocol: policybpf.ProtocolTCP, Port: 8080}}},
			{CIDR: netip.MustParsePrefix("10.0.0.0/8"), Except: []netip.Prefix{netip.MustParsePrefix("10.130.0.0/16")},
				Ports: []Port{{Protocol: policybpf.ProtocolUDP, Port: 53}}},
			{CIDR: netip.MustParsePrefix("::/0"), Except: []netip.Prefix{netip.MustParsePrefix("100::/64"), netip.MustParsePrefix("fe80::/10")},
				Ports: []Port{{Protocol: policybpf.ProtocolTCP, Port: 443}}},
		},
	}
	if !reflect.DeepEqual(pe, want) {
		t.Errorf("parsed\n%+v\nwant\n%+v", pe, want)
	}
}

// minimal is a valid PolicyEndpoint with spec lines to be appended.
func minimal(spec string) string {
	return "apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: p, namespace: ns}\nspec:\n  policyRef: {name: p}\n" + spec
}

func TestParseErrorsNameFileFieldAndValue(t *testing.T) {
	for _, tc := range []struct {
		name, file, want string
	}{
		{"bad yaml", "a: [", "f.yaml: not valid YAML or JSON"},
		{"duplicate key", minimal("  podIsolation: [Egress]\n  podIsolation: [Ingress]\n"), `f.yaml: not valid YAML or JSON`},
		{"not a mapping", "- a", "f.yaml: want a PolicyEndpoint, a ClusterPolicyEndpoint or a List"},
		{"two JSON values in a document", `{"apiVersion": "v1"} {"kind": "List"}`, "f.yaml: not valid YAML or JSON: data after the first value"},
		{"no kind", "apiVersion: v1", "f.yaml: field kind is missing"},
		{"wrong kind", "apiVersion: v1\nkind: ConfigMap", `f.yaml: field kind: value "ConfigMap" is not PolicyEndpoint`},
		{"wrong api", strings.Replace(minimal(""), "networking.k8s.aws/v1alpha1", "networking.k8s.aws/v1", 1), `field apiVersion: value "networking.k8s.aws/v1" is not networking.k8s.aws/v1alpha1`},
		{"no name", "apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {namespace: ns}\nspec: {}", "field metadata.name is missing"},
		{"bad name", "apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: a/b, namespace: ns}\nspec: {}", `field metadata.name: value "a/b" is not an object name`},
		{"no spec", "apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: a, namespace: ns}", "ns/a: field spec is missing"},
		{"no policyRef", "apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: a, namespace: ns}\nspec: {}", "ns/a: field spec.policyRef is missing"},
		{"isolation", minimal("  podIsolation: [Both]\n"), `field spec.podIsolation[0]: value "Both" is not Ingress or Egress`},
		{"isolation type", minimal("  podIsolation: Egress\n"), `field spec.podIsolation: value "Egress" is not a list of policy types`},
		{"pod ip", minimal("  podSelectorEndpoints: [{podIP: 10.0.0.300}]\n"), `field spec.podSelectorEndpoints[0].podIP: value "10.0.0.300" is not an IP address`},
		{"pod ip prefix", minimal("  podSelectorEndpoints: [{podIP: 10.0.0.3/32}]\n"), `value "10.0.0.3/32" is not an IP address`},
		{"mapped pod ip", minimal("  podSelectorEndpoints: [{podIP: '::ffff:10.0.0.3'}]\n"), `is an IPv4-mapped IPv6 address`},
		{"no pod ip", minimal("  podSelectorEndpoints: [{hostIP: 10.0.0.1}]\n"), `field spec.podSelectorEndpoints[0].podIP is missing`},
		{"cidr", minimal("  egress: [{cidr: 10.0.0.0/33}]\n"), `field spec.egress[0].cidr: value "10.0.0.0/33" is not a CIDR`},
		{"no cidr", minimal("  ingress: [{ports: [{port: 80}]}]\n"), `field spec.ingress[0].cidr is missing`},
		{"except", minimal("  egress: [{cidr: 10.0.0.0/8, except: [x]}]\n"), `field spec.egress[0].except[0]: value "x" is not a CIDR`},
		{"except type", minimal("  egress: [{cidr: 10.0.0.0/8, except: 10.1.0.0/16}]\n"), `field spec.egress[0].except: value "10.1.0.0/16" is not a list of CIDRs`},
		{"protocol", minimal("  egress: [{cidr: 10.0.0.0/8, ports: [{protocol: tcp}]}]\n"), `field spec.egress[0].ports[0].protocol: value "tcp" is not TCP, UDP or SCTP`},
		{"named port", minimal("  egress: [{cidr: 10.0.0.0/8, ports: [{port: http}]}]\n"), `field spec.egress[0].ports[0].port: value "http" is not an integer`},
		{"quoted port", minimal("  egress: [{cidr: 10.0.0.0/8, ports: [{port: '80'}]}]\n"), `field spec.egress[0].ports[0].port: value "80" is not an integer`},
		{"port range", minimal("  egress: [{cidr: 10.0.0.0/8, ports: [{port: 65536}]}]\n"), `field spec.egress[0].ports[0].port: value 65536 is outside 1..65535`},
		{"port zero", minimal("  egress: [{cidr: 10.0.0.0/8, ports: [{port: 0}]}]\n"), `value 0 is outside 1..65535`},
		{"port float", minimal("  egress: [{cidr: 10.0.0.0/8, ports: [{port: 80.5}]}]\n"), `value 80.5 is not an integer`},
		{"endPort alone", minimal("  egress: [{cidr: 10.0.0.0/8, ports: [{endPort: 90}]}]\n"), `field spec.egress[0].ports[0].endPort: value 90 needs a port`},
		{"endPort below", minimal("  egress: [{cidr: 10.0.0.0/8, ports: [{port: 90, endPort: 80}]}]\n"), `value 80 is below port 90`},
		{"selector", minimal("  podSelector: {matchLabels: {a: [b]}}\n"), `ns/p: field spec.podSelector.matchLabels.a: value ["b"] is not a string`},
		{"rule type", minimal("  ingress: [{cidr: 10.0.0.0/8}, 10.1.0.0/16]\n"), `ns/p: field spec.ingress[1]: value "10.1.0.0/16" is not a mapping`},
		{"kind type", "kind: [PolicyEndpoint]", `f.yaml: field kind: value [PolicyEndpoint] is not PolicyEndpoint, ClusterPolicyEndpoint, PolicyEndpointList, ClusterPolicyEndpointList or List`},
		{"list field", "apiVersion: v1\nkind: List\nitem: []", `f.yaml: field item: unknown field "item" (known: apiVersion, kind, metadata, items)`},
		{"item not a mapping", "apiVersion: v1\nkind: List\nitems: [x]", `f.yaml: field items[0]: value "x" is not a mapping`},
		{"duplicate key in JSON", `{"kind": "PolicyEndpoint", "kind": "PolicyEndpoint"}`, `f.yaml: not valid YAML or JSON`},
		{"several errors", minimal("  podIsolation: [Egress]\n  egress: [{cidr: 10.0.0.0/33, ports: [{port: 0}]}]\n"),
			`ns/p: field spec.egress[0].cidr: value "10.0.0.0/33" is not a CIDR; field spec.egress[0].ports[0].port: value 0 is outside 1..65535`},
		{"list items", "apiVersion: v1\nkind: List\nitems: [{kind: PolicyEndpoint, apiVersion: networking.k8s.aws/v1alpha1, metadata: {name: a, namespace: b}, spec: {policyRef: {name: a}, egress: [{cidr: x}]}}]",
			`f.yaml: b/a: field items[0].spec.egress[0].cidr: value "x" is not a CIDR`},
		{"document marker with content", minimal("") + "--- {a: 1}\n", `f.yaml: line 6: document marker "---" followed by "{a: 1}"`},
		{"second document", minimal("") + "---\n" + minimal("  egress: [{cidr: 1.2.3.4/40}]\n"), `f.yaml: document 2: ns/p: field spec.egress[0].cidr`},
		{"twice", minimal("") + "---\n" + minimal(""), `f.yaml: document 2: PolicyEndpoint ns/p is defined twice (first in f.yaml: document 1)`},
		{"too large", strings.Repeat("#", MaxPolicyEndpointFileSize+1), "f.yaml: file is larger than 8388608 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pes, err := ParsePolicyEndpoints("f.yaml", []byte(tc.file))
			if err == nil {
				t.Fatalf("accepted: %+v", pes)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tc.want)
			}
		})
	}
}

func TestParseWarnings(t *testing.T) {
	for _, tc := range []struct {
		name, spec string
		want       []string
		check      func(t *testing.T, pe *PolicyEndpoint)
	}{
		{"host bits", "  podIsolation: [Egress]\n  egress: [{cidr: 10.1.2.3/8, except: [10.1.2.3/16]}]\n",
			[]string{`spec.egress[0].cidr: "10.1.2.3/8" has host bits set: using 10.0.0.0/8`, `spec.egress[0].except[0]: "10.1.2.3/16" has host bits set: using 10.1.0.0/16`},
			func(t *testing.T, pe *PolicyEndpoint) {
				if pe.Egress[0].CIDR.String() != "10.0.0.0/8" || pe.Egress[0].Except[0].String() != "10.1.0.0/16" {
					t.Errorf("%+v", pe.Egress)
				}
			}},
		{"except of the other family", "  podIsolation: [Egress]\n  egress: [{cidr: 0.0.0.0/0, except: ['100::/64', 'fe80::/10', 10.0.0.0/8]}]\n",
			[]string{"spec.egress[0].except[0]: 100::/64 is IPv6 but the rule's cidr 0.0.0.0/0 is IPv4: dropped",
				"spec.egress[0].except[1]: fe80::/10 is IPv6 but the rule's cidr 0.0.0.0/0 is IPv4: dropped"},
			func(t *testing.T, pe *PolicyEndpoint) {
				if !slices.Equal(pe.Egress[0].Except, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}) {
					t.Errorf("excepts %v", pe.Egress[0].Except)
				}
			}},
		{"except outside", "  podIsolation: [Ingress]\n  ingress: [{cidr: 10.0.0.0/8, except: [11.0.0.0/8]}]\n",
			[]string{"spec.ingress[0].except[0]: 11.0.0.0/8 is outside the rule's cidr 10.0.0.0/8: dropped (it excludes nothing)"}, nil},
		{"except covering", "  podIsolation: [Ingress]\n  ingress: [{cidr: 10.0.0.0/8, except: [10.0.0.0/8]}]\n",
			[]string{"spec.ingress[0].except[0]: 10.0.0.0/8 covers the rule's whole cidr 10.0.0.0/8: the rule allows nothing"}, nil},
		{"rules without isolation", "  podIsolation: [Ingress]\n  egress: [{cidr: 10.0.0.0/8}]\n",
			[]string{"spec.egress: 1 rules, but podIsolation does not list Egress: they have no effect"}, nil},
		{"duplicate pod", "  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}, {hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n",
			[]string{"spec.podSelectorEndpoints[1]: podIP 10.0.0.5 is listed twice (also spec.podSelectorEndpoints[0]): the first is used"}, nil},
		{"host of the other family", "  podSelectorEndpoints: [{hostIP: 'fd00::1', podIP: 10.0.0.5}]\n",
			[]string{"spec.podSelectorEndpoints[0]: hostIP fd00::1 is not of the family of podIP 10.0.0.5: the node IP is not added for this pod IP"},
			func(t *testing.T, pe *PolicyEndpoint) {
				if pe.Pods[0].HostIP.IsValid() {
					t.Error("host IP kept")
				}
			}},
		{"no host", "  podSelectorEndpoints: [{podIP: 10.0.0.5}]\n",
			[]string{"spec.podSelectorEndpoints[0]: no hostIP: the node IP is not added for pod IP 10.0.0.5"}, nil},
		{"bare address cidr", "  podIsolation: [Egress]\n  egress: [{cidr: 10.0.0.7, ports: [{port: 80, endPort: 80}, {protocol: SCTP}]}]\n", nil,
			func(t *testing.T, pe *PolicyEndpoint) {
				want := Rule{CIDR: netip.MustParsePrefix("10.0.0.7/32"), Ports: []Port{{Protocol: policybpf.ProtocolTCP, Port: 80}, {Protocol: policybpf.ProtocolSCTP}}}
				if !reflect.DeepEqual(pe.Egress[0], want) {
					t.Errorf("%+v", pe.Egress[0])
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pes, err := ParsePolicyEndpoints("f.yaml", []byte(minimal(tc.spec)))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pes[0].Warnings, tc.want) {
				t.Errorf("warnings\n%q\nwant\n%q", pes[0].Warnings, tc.want)
			}
			if tc.check != nil {
				tc.check(t, pes[0])
			}
		})
	}
}

func TestParseEmptyAndCommentOnly(t *testing.T) {
	for _, data := range []string{"", "# nothing\n", "---\n---\n", "\n\n"} {
		pes, err := ParsePolicyEndpoints("f", []byte(data))
		if err != nil || len(pes) != 0 {
			t.Errorf("%q: %v %v", data, pes, err)
		}
	}
}

// encodePolicyEndpoints writes objects back as a PolicyEndpointList in
// JSON, the way the controller would.
func encodePolicyEndpoints(pes []*PolicyEndpoint) ([]byte, error) {
	type port struct {
		Protocol string `json:"protocol"`
		Port     uint16 `json:"port,omitempty"`
		EndPort  uint16 `json:"endPort,omitempty"`
	}
	type rule struct {
		CIDR       string   `json:"cidr,omitempty"`
		DomainName string   `json:"domainName,omitempty"`
		Except     []string `json:"except,omitempty"`
		Ports      []port   `json:"ports,omitempty"`
	}
	type pod struct {
		HostIP    string `json:"hostIP,omitempty"`
		PodIP     string `json:"podIP"`
		Name      string `json:"name,omitempty"`
		Namespace string `json:"namespace,omitempty"`
	}
	protoName := map[uint32]string{policybpf.ProtocolTCP: "TCP", policybpf.ProtocolUDP: "UDP", policybpf.ProtocolSCTP: "SCTP"}
	rules := func(rs []Rule) []rule {
		var out []rule
		for _, r := range rs {
			o := rule{CIDR: r.CIDR.String()}
			for _, e := range r.Except {
				o.Except = append(o.Except, e.String())
			}
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
			o := rule{DomainName: n.Pattern}
			for _, p := range n.Ports {
				o.Ports = append(o.Ports, port{protoName[p.Protocol], p.Port, p.EndPort})
			}
			out = append(out, o)
		}
		return out
	}
	var items []any
	for _, pe := range pes {
		ns, name, _ := strings.Cut(pe.PolicyRef, "/")
		var iso []string
		if pe.IsolatesIngress {
			iso = append(iso, "Ingress")
		}
		if pe.IsolatesEgress {
			iso = append(iso, "Egress")
		}
		var pods []pod
		for _, p := range pe.Pods {
			o := pod{PodIP: p.PodIP.String(), Name: p.Name, Namespace: p.Namespace}
			if p.HostIP.IsValid() {
				o.HostIP = p.HostIP.String()
			}
			pods = append(pods, o)
		}
		items = append(items, map[string]any{
			"apiVersion": PolicyEndpointAPIVersion,
			"kind":       PolicyEndpointKind,
			"metadata":   map[string]string{"name": pe.Name, "namespace": pe.Namespace},
			"spec": map[string]any{
				"policyRef":            map[string]string{"name": name, "namespace": ns},
				"podIsolation":         iso,
				"podSelectorEndpoints": pods,
				"ingress":              rules(pe.Ingress),
				"egress":               append(rules(pe.Egress), names(pe.EgressNames)...),
			},
		})
	}
	return json.Marshal(map[string]any{"apiVersion": PolicyEndpointAPIVersion, "kind": "PolicyEndpointList", "items": items})
}

// withoutWarnings returns copies of the objects without warnings: a round
// trip drops the items that caused them.
func withoutWarnings(pes []*PolicyEndpoint) []PolicyEndpoint {
	out := make([]PolicyEndpoint, len(pes))
	for i, pe := range pes {
		out[i] = *pe
		out[i].Warnings = nil
	}
	return out
}

// FuzzParsePolicyEndpoints: no input panics or is accepted beyond the
// limits, and an accepted file, written back out and parsed again, gives the
// same objects.
func FuzzParsePolicyEndpoints(f *testing.F) {
	sample, err := os.ReadFile(samplePath)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sample)
	for _, seed := range []string{
		"", "---", minimal(""), minimal("  podIsolation: [Egress, Ingress]\n  egress: [{cidr: 10.1.2.3/8, except: ['fe80::/10', 10.1.0.0/16], ports: [{port: 80, endPort: 90}, {protocol: UDP}]}]\n"),
		minimal("  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}, {hostIP: 'fd00::1', podIP: 'fd00::5'}]\n  ingress: [{cidr: '::/0'}]\n"),
		`{"apiVersion":"v1","kind":"List","items":[]}`, "apiVersion: v1\nkind: List\nitems: [{}]", "- a", "a: [",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pes, err := ParsePolicyEndpoints("fuzz", data)
		if err != nil {
			return
		}
		for _, pe := range pes {
			for _, r := range append(slices.Clone(pe.Ingress), pe.Egress...) {
				if r.CIDR.Masked() != r.CIDR || r.CIDR.Addr().Is4In6() {
					t.Fatalf("cidr %s accepted as is", r.CIDR)
				}
				for _, e := range r.Except {
					if bpf.FamilyOf(e.Addr()) != bpf.FamilyOf(r.CIDR.Addr()) || !e.Overlaps(r.CIDR) {
						t.Fatalf("except %s kept in rule %s", e, r.CIDR)
					}
				}
				for _, p := range r.Ports {
					if p.EndPort != 0 && p.EndPort <= p.Port {
						t.Fatalf("port range %d-%d", p.Port, p.EndPort)
					}
				}
			}
			// Compiling never panics and never makes a key of the wrong
			// family.
			for _, p := range pe.Pods {
				for _, e := range compile.CompilePod(p.PodIP, []*PolicyEndpoint{pe}) {
					if _, f, _ := policybpf.ParsePolicyMapName(e.Map()); f != bpf.FamilyOf(p.PodIP) {
						t.Fatalf("entry %v in map %s", e.TableRow(), e.Map())
					}
				}
			}
		}
		out, err := encodePolicyEndpoints(pes)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParsePolicyEndpoints("fuzz", out)
		if err != nil {
			t.Fatalf("re-parse of %s: %s", out, err)
		}
		if !reflect.DeepEqual(withoutWarnings(pes), withoutWarnings(again)) {
			t.Fatalf("round trip changed objects:\n%+v\n%+v", withoutWarnings(pes), withoutWarnings(again))
		}
	})
}

// TestParseLimits: an object over a limit is refused with an error naming
// the file, the object, the count and the limit.
func TestParseLimits(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: big, namespace: ns}\nspec:\n  policyRef: {name: big}\n  podIsolation: [Egress]\n  egress:\n")
	for i := range MaxPolicyEndpointRules + 1 {
		fmt.Fprintf(&b, "  - cidr: 10.%d.%d.0/24\n", i>>8&255, i&255)
	}
	_, err := ParsePolicyEndpoints("/pe/big.yaml", []byte(b.String()))
	want := fmt.Sprintf("%d rules (ingress and egress), a PolicyEndpoint may have at most %d", MaxPolicyEndpointRules+1, MaxPolicyEndpointRules)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "/pe/big.yaml") || !strings.Contains(err.Error(), "ns/big") {
		t.Fatalf("got %v, want an error with the file, the object and %q", err, want)
	}
	t.Log(err)
}
