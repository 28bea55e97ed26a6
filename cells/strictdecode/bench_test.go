package strictdecode

import (
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// largeDocument is a PolicyEndpoint-like document of n egress rules.
func largeDocument(n int) []byte {
	var b strings.Builder
	b.WriteString("apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: p, namespace: ns}\nspec:\n  egress:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - cidr: 10.%d.%d.0/24\n    ports:\n    - {protocol: TCP, port: %d}\n", i/256%256, i%256, 1000+i%1000)
	}
	return []byte(b.String())
}

// BenchmarkToJSON is ToJSON against the YAMLToJSONStrict it wraps (the
// floor) on a 5,000-rule document: the one-document check's share.
func BenchmarkToJSON(b *testing.B) {
	doc := largeDocument(5000)
	b.Run("floor-YAMLToJSONStrict", func(b *testing.B) {
		for b.Loop() {
			if _, err := yaml.YAMLToJSONStrict(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ToJSON", func(b *testing.B) {
		for b.Loop() {
			if _, err := ToJSON(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
