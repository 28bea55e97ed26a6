package source

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A field enimasq does not know is not bad input: the object is decoded
// as a Kubernetes client decodes a newer object (the field ignored, every
// known field read and validated) and the field is named by its path. A
// known field with a bad value next to it stays an error.
func TestParseUnknownFieldsAreNamed(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		unknown    []string
		check      func(*parsedObject) bool
	}{
		// What the controller v1.1.10 writes on every ClusterPolicyEndpoint
		// (api/v1alpha1/clusterpolicyendpoint_types.go: no omitempty).
		{"controller's subject", clusterMinimal("  subject:\n    namespaces:\n      matchLabels: {team: a}\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  egress: [{cidr: 10.1.0.0/16, action: Deny}]\n"),
			[]string{"spec.subject"}, func(o *parsedObject) bool {
				return len(rowOf[*ClusterPolicyEndpoint](*o).Egress) == 1 && len(rowOf[*ClusterPolicyEndpoint](*o).Pods) == 1
			}},
		{"cluster policyRef namespace", "apiVersion: networking.k8s.aws/v1alpha1\nkind: ClusterPolicyEndpoint\nmetadata: {name: c}\nspec: {policyRef: {name: a, namespace: b}, tier: Admin, priority: 1}",
			[]string{"spec.policyRef.namespace"}, func(o *parsedObject) bool { return rowOf[*ClusterPolicyEndpoint](*o).PolicyRef == "a" }},
		{"cluster rule field", clusterMinimal("  egress: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16], action: Deny}]\n"),
			[]string{"spec.egress[0].except"}, func(o *parsedObject) bool { return len(rowOf[*ClusterPolicyEndpoint](*o).Egress) == 1 }},
		{"metadata", strings.Replace(minimal(""), "namespace: ns}", "namespace: ns, nmae: x}", 1),
			[]string{"metadata.nmae"}, func(o *parsedObject) bool { return rowOf[*PolicyEndpoint](*o).Key() == "ns/p" }},
		{"spec", minimal("  podIsolation: [Egress]\n  egres: []\n"), []string{"spec.egres"}, func(o *parsedObject) bool { return rowOf[*PolicyEndpoint](*o).IsolatesEgress }},
		{"selector", minimal("  podSelector: {matchExpressions: [{key: a, operator: In, value: [b]}]}\n"),
			[]string{"spec.podSelector.matchExpressions[0].value"}, nil},
		{"port", minimal("  podIsolation: [Egress]\n  egress: [{cidr: 10.0.0.0/8, ports: [{port: 80, prot: UDP}]}]\n"),
			[]string{"spec.egress[0].ports[0].prot"}, func(o *parsedObject) bool { return rowOf[*PolicyEndpoint](*o).Egress[0].Ports[0].Port == 80 }},
		{"dotted", minimal("  podSelectorEndpoints: [{podIP: 10.0.0.1, hostIP.x: y}]\n"),
			[]string{"spec.podSelectorEndpoints[0].hostIP.x"}, func(o *parsedObject) bool { return len(rowOf[*PolicyEndpoint](*o).Pods) == 1 }},
		{"list item", "apiVersion: v1\nkind: List\nitems: [{kind: PolicyEndpoint, apiVersion: networking.k8s.aws/v1alpha1, metadata: {name: a, namespace: b}, spec: {policyRef: {name: a}, egress: [{cidr: 10.0.0.0/8, ports: [{port: 80, prot: UDP}]}]}}]",
			[]string{"items[0].spec.egress[0].ports[0].prot"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := parsePolicyFile("f.yaml", []byte(tc.file))
			if err != nil || len(objs) != 1 {
				t.Fatalf("refused: %v (%+v)", err, objs)
			}
			o := &objs[0]
			unknown := o.unknown()
			if !slices.Equal(unknown, tc.unknown) {
				t.Errorf("unknown fields %q, want %q", unknown, tc.unknown)
			}
			if tc.check != nil && !tc.check(o) {
				t.Errorf("known fields not decoded: %+v %+v", rowOf[*PolicyEndpoint](*o), rowOf[*ClusterPolicyEndpoint](*o))
			}
		})
	}
	// A bad value beside an unknown field is an error, naming the value.
	_, err := ParseClusterPolicyEndpoints("f.yaml", []byte(clusterMinimal("  subject: {}\n  egress: [{cidr: 10.0.0.0/33, action: Deny}]\n")))
	if err == nil || !strings.Contains(err.Error(), `field spec.egress[0].cidr: value "10.0.0.0/33" is not a CIDR`) || strings.Contains(err.Error(), "subject") {
		t.Errorf("error %v", err)
	}
}

// unknown is the object's unknown fields, of either kind.
func (o *parsedObject) unknown() []string {
	return *o.row.Common().Unknown
}

// The source names each object's unknown field once in the log and the
// metric, however often it reads the object, and again for an object that
// comes back; the health text counts the objects.
func TestUnknownFieldsNamedOnce(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	counter := newUnknownFieldsCounter()
	u := newUnknownFields(ClusterPolicyEndpointKind, counter)
	two := map[string][]string{"a": {"spec.subject"}, "b": {"spec.subject", "spec.egress[3].x"}}
	for range 3 {
		if got, want := u.note(log, two), "; fields enimasq does not know, ignored: spec.egress[].x (1 objects), spec.subject (2 objects)"; got != want {
			t.Fatalf("health text %q, want %q", got, want)
		}
	}
	if n := strings.Count(buf.String(), "does not know"); n != 3 {
		t.Errorf("logged %d times, want 3:\n%s", n, buf.String())
	}
	if got := testutil.ToFloat64(counter.WithLabelValues(ClusterPolicyEndpointKind, "spec.subject")); got != 2 {
		t.Errorf("spec.subject counted %v times, want 2", got)
	}
	u.note(log, map[string][]string{"b": {"spec.subject", "spec.egress[3].x"}}) // a is gone
	if got := u.note(log, two); !strings.Contains(got, "spec.subject (2 objects)") {
		t.Errorf("health text %q", got)
	}
	if got := testutil.ToFloat64(counter.WithLabelValues(ClusterPolicyEndpointKind, "spec.subject")); got != 3 {
		t.Errorf("spec.subject counted %v times after a came back, want 3", got)
	}
	if got := u.note(log, map[string][]string{"b": nil}); got != "" {
		t.Errorf("health text without unknown fields: %q", got)
	}
}

// A field's label value is valid UTF-8 and bounded, however the file
// spells the field: a label cut inside a character would make the metric
// refuse it (and WithLabelValues panic).
func TestUnknownFieldLabelIsUTF8(t *testing.T) {
	u := newUnknownFields(PolicyEndpointKind, newUnknownFieldsCounter())
	long := "spec." + strings.Repeat("a", 122) + strings.Repeat("é", 10)
	label := u.label(long)
	if !utf8.ValidString(label) || len(label) > maxFieldLabel {
		t.Errorf("label %q (%d bytes)", label, len(label))
	}
	u.note(slog.New(slog.DiscardHandler), map[string][]string{"ns/p": {long}})
}
