package strictdecode

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// flowDocument is a PolicyEndpoint-like document of n egress rules as a
// person writes it: flow mappings inside block ones.
func flowDocument(n int) []byte {
	var b strings.Builder
	b.WriteString("apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: p, namespace: ns}\nspec:\n  egress:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - cidr: 10.%d.%d.0/24\n    ports:\n    - {protocol: TCP, port: %d}\n", i/256%256, i%256, 1000+i%1000)
	}
	return []byte(b.String())
}

// blockDocument is the same document as kubectl prints it: block style
// only.
func blockDocument(n int) []byte {
	var b strings.Builder
	b.WriteString("apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata:\n  name: p\n  namespace: ns\nspec:\n  egress:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - cidr: 10.%d.%d.0/24\n    ports:\n    - port: %d\n      protocol: TCP\n", i/256%256, i%256, 1000+i%1000)
	}
	return []byte(b.String())
}

// BenchmarkToJSON is ToJSON on a 5,000-rule document that the block
// reader takes (fast) and on one it declines (fallback: flow style), each
// against the YAMLToJSONStrict it stands for on the same document, timed
// in the same iterations (x-floor).
func BenchmarkToJSON(b *testing.B) {
	for _, c := range []struct {
		name string
		doc  []byte
		fast bool
	}{{"fast", blockDocument(5000), true}, {"fallback", flowDocument(5000), false}} {
		b.Run(c.name, func(b *testing.B) {
			if _, ok := blockToJSON(c.doc); ok != c.fast {
				b.Fatalf("the block reader takes the document: %t, want %t", ok, c.fast)
			}
			var floor, total time.Duration
			for b.Loop() {
				b.StopTimer()
				start := time.Now()
				if _, err := yaml.YAMLToJSONStrict(c.doc); err != nil {
					b.Fatal(err)
				}
				floor += time.Since(start)
				b.StartTimer()
				start = time.Now()
				if _, err := ToJSON(c.doc); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
			}
			b.ReportMetric(float64(floor.Microseconds())/float64(b.N), "floor-us")
			b.ReportMetric(float64(total)/float64(floor), "x-floor")
		})
	}
}
