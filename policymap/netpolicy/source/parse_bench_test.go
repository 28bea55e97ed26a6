package source

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkParsePolicyEndpoint5000Rules decodes and validates one
// PolicyEndpoint file of 5,000 egress rules (340 KB of YAML, as kubectl
// prints it), the unit of the 50k-rule benchmark, and reports the share of
// the YAML to JSON step (strict-decoder floor: json-ms).
func BenchmarkParsePolicyEndpoint5000Rules(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata:\n  name: rules\n  namespace: bench\nspec:\n  policyRef:\n    name: rules\n    namespace: bench\n  podIsolation:\n  - Egress\n  podSelectorEndpoints:\n  - hostIP: 10.255.0.1\n    podIP: 10.250.0.5\n    name: pod\n    namespace: bench\n  egress:\n")
	for i := range 5000 {
		fmt.Fprintf(&sb, "  - cidr: 10.1.%d.%d/32\n    ports:\n    - protocol: TCP\n      port: %d\n", i>>8, i&0xff, 1000+i)
	}
	data := []byte(sb.String())
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		pes, err := ParsePolicyEndpoints("bench.yaml", data)
		if err != nil || len(pes) != 1 || len(pes[0].Egress) != 5000 {
			b.Fatal(err)
		}
	}
}
