package source

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// TestStandIns: what an invalid object without a last good version puts in
// force, by what can be read of it.
func TestStandIns(t *testing.T) {
	for _, tc := range []struct {
		name, file      string
		key, isolation  string
		pods            string
		hostIP, invalid string
	}{
		{"bad value", minimal("  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  egress: [{cidr: 10.0.0.0/33}]\n"),
			"ns/p", "Egress", "10.0.0.5", "10.0.0.1", `field spec.egress[0].cidr: value "10.0.0.0/33" is not a CIDR`},
		{"isolation not a list", minimal("  podIsolation: Ingress\n  podSelectorEndpoints: [{podIP: 10.0.0.5}]\n"),
			"ns/p", "Ingress,Egress", "10.0.0.5", "invalid IP", "is not a list of policy types"},
		{"isolation missing", minimal("  podSelectorEndpoints: [{podIP: 10.0.0.5}]\n  ingress: [{cidr: x}]\n"),
			"ns/p", "Ingress,Egress", "10.0.0.5", "invalid IP", `value "x" is not a CIDR`},
		{"isolation of another case", minimal("  podIsolation: [Ingress, egress]\n  podSelectorEndpoints: [{podIP: 10.0.0.5}]\n"),
			"ns/p", "Ingress,Egress", "10.0.0.5", "invalid IP", `value "egress" is not Ingress or Egress`},
		{"one bad pod IP", minimal("  podIsolation: [Ingress]\n  podSelectorEndpoints: [{podIP: 10.0.0.300}, {podIP: 10.0.0.6}]\n"),
			"ns/p", "Ingress", "10.0.0.6", "invalid IP", "is not an IP address"},
		{"pods not a list", minimal("  podIsolation: [Ingress]\n  podSelectorEndpoints: {podIP: 10.0.0.7}\n"),
			"ns/p", "Ingress", "10.0.0.7", "invalid IP", "is not a list"},
		{"not YAML", "metadata: {name: p, namespace: ns\nspec:\n  podSelectorEndpoints:\n  - podIP: 10.0.0.8\n  - {\"podIP\": \"fd00::8\"}\n",
			"f.yaml#1", "Ingress,Egress", "10.0.0.8,fd00::8", "invalid IP", "not valid YAML or JSON"},
		{"bad name", "apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: a/b, namespace: ns}\nspec: {podIsolation: [Egress], podSelectorEndpoints: [{podIP: 10.0.0.9}]}",
			"f.yaml#1", "Egress", "10.0.0.9", "invalid IP", "is not an object name"},
		{"list item", "apiVersion: v1\nkind: List\nitems:\n- {kind: PolicyEndpoint, metadata: {name: a}, spec: {podIsolation: [Egress], podSelectorEndpoints: [{podIP: 10.0.0.10}]}}",
			"f.yaml#1.items[0]", "Egress", "10.0.0.10", "invalid IP", "field items[0].apiVersion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := parsePolicyFile("f.yaml", []byte(tc.file))
			if err == nil || len(objs) != 1 || objs[0].err == nil {
				t.Fatalf("want one invalid object, got %+v, %v", objs, err)
			}
			pe := policyEndpoints.resolve(objs, nil)[0]
			if pe.Key() != tc.key || pe.Isolation() != tc.isolation || pe.PodList() != tc.pods || pe.Pods[0].HostIP.String() != tc.hostIP ||
				!pe.StandIn || len(pe.Ingress)+len(pe.Egress) != 0 || !strings.Contains(pe.Invalid, tc.invalid) {
				t.Errorf("stand-in %s %s %s host %s rules %d/%d invalid %q\nwant %s %s %s host %s, no rules, %q",
					pe.Key(), pe.Isolation(), pe.PodList(), pe.Pods[0].HostIP, len(pe.Ingress), len(pe.Egress), pe.Invalid,
					tc.key, tc.isolation, tc.pods, tc.hostIP, tc.invalid)
			}
		})
	}
}

// TestResolve: an invalid object keeps its last good version; a document
// whose key cannot be read keeps every last good object of the file; a
// valid object of a file in error applies.
func TestResolve(t *testing.T) {
	good, err := ParsePolicyEndpoints("f.yaml", []byte(minimal("  podIsolation: [Egress]\n  podSelectorEndpoints: [{podIP: 10.0.0.5}]\n  egress: [{cidr: 10.0.0.0/8}]\n")+
		"---\n"+strings.ReplaceAll(minimal("  podIsolation: [Ingress]\n  podSelectorEndpoints: [{podIP: 10.0.0.6}]\n"), "name: p", "name: q")))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parsePolicyFile("f.yaml", []byte(minimal("  podIsolation: [Egress]\n  egress: [{cidr: 10.0.0.0/33}]\n")+
		"---\n"+strings.ReplaceAll(minimal("  podIsolation: [Ingress]\n  podSelectorEndpoints: [{podIP: 10.0.0.7}]\n"), "name: p", "name: q")))
	if err == nil {
		t.Fatal("accepted")
	}
	out := policyEndpoints.resolve(objs, good)
	if len(out) != 2 || out[0].Key() != "ns/p" || len(out[0].Egress) != 1 || out[0].Invalid == "" || out[0].StandIn ||
		out[1].Key() != "ns/q" || out[1].PodList() != "10.0.0.7" || out[1].Invalid != "" {
		t.Errorf("resolved %+v", out)
	}

	objs, _ = parsePolicyFile("f.yaml", []byte("a: [\n"))
	out = policyEndpoints.resolve(objs, good)
	var keys []string
	for _, pe := range out {
		keys = append(keys, pe.Key())
	}
	if !slices.Equal(keys, []string{"f.yaml#1", "ns/p", "ns/q"}) || out[1].Invalid == "" || len(out[1].Egress) != 1 {
		t.Errorf("unreadable document: %v %+v", keys, out)
	}
}

// TestPolicySourceRereadsInvalidFile: a file that stays invalid gives the
// same stand-in on every read (it never becomes a "last good version").
func TestPolicySourceRereadsInvalidFile(t *testing.T) {
	dir := t.TempDir()
	bad := minimal("  podIsolation: [Egress]\n  podSelectorEndpoints: [{podIP: 10.0.0.5}]\n  egress: [{cidr: 10.0.0.0/33}]\n")
	if err := os.WriteFile(filepath.Join(dir, "b.yaml"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	pes, cpes := newTable(policyEndpoints, filesource.Source[*PolicyEndpoint, string]{}), newTable(clusterPolicyEndpoints, filesource.Source[*ClusterPolicyEndpoint, string]{})
	s := newPolicySource(Settings{Path: dir}, nodeconfig.Config{EnableIPv4: true}, nil, pes, cpes)
	for i := range 3 {
		d := s.read()
		pe, cpe := pes.result(d), cpes.result(d)
		in, err := pe.in, pe.err
		if cpe.err != nil || len(cpe.in.Rows) != 0 {
			t.Fatalf("read %d: ClusterPolicyEndpoints %+v, %v", i, cpe.in, cpe.err)
		}
		var unknown interface{ Unwrap() []error }
		if !errors.As(err, &unknown) || len(in.Rows) != 1 || !in.Rows[0].StandIn || len(in.Rows[0].Warnings) != 1 || in.Incomplete {
			t.Fatalf("read %d: %+v, %v", i, in, err)
		}
	}
}
