package compile

import (
	"fmt"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// compileClusterScenario compiles every pod IP of the node's families into
// both kinds of entries.
func compileClusterScenario(t testing.TB, s clusterScenario, node nodeconfig.Config) ([]*PolicyMapEntry, []*ClusterMapEntry) {
	pes, cpes := s.parseCluster(t)
	var np []*PolicyMapEntry
	var cp []*ClusterMapEntry
	for _, pod := range s.NP.podIPs() {
		if node.FamilyEnabled(pod) {
			np = append(np, CompilePod(pod, pes)...)
			cp = append(cp, CompileClusterPod(pod, cpes)...)
		}
	}
	return np, cp
}

// decodeValue decodes an entry's value with its chunks.
func decodeValue(value []byte, spill []bpf.SpillEntry) policybpf.PolicyValue {
	chunks := map[string][]byte{}
	for _, c := range spill {
		chunks[string(c.Key)] = c.Value
	}
	v, err := policybpf.UnmarshalPolicyValue(value, func(k []byte) ([]byte, error) {
		c, ok := chunks[string(k)]
		if !ok {
			return nil, policybpf.ErrChunkMissing
		}
		return c, nil
	})
	if err != nil {
		panic(err)
	}
	return v
}

// evalClusterEntries is the program's decision, in Go, on both kinds of
// entries: the pod's longest matching key in the NetworkPolicy map and in
// the cluster map of the direction and family, then policybpf.EvaluatePolicy.
func evalClusterEntries(np []*PolicyMapEntry, cp []*ClusterMapEntry, strict bool, p packet) policybpf.PolicyResult {
	fam := bpf.FamilyOf(p.Pod)
	var bestNP *PolicyMapEntry
	for _, e := range np {
		if e.Map() == policybpf.PolicyMapName(p.Dir, fam) && e.Pod == p.Pod && e.Peer().Contains(p.Peer) && (bestNP == nil || e.Peer().Bits() > bestNP.Peer().Bits()) {
			bestNP = e
		}
	}
	var bestCP *ClusterMapEntry
	for _, e := range cp {
		if e.Map() == policybpf.ClusterMapName(p.Dir, fam) && e.Pod == p.Pod && e.Peer().Contains(p.Peer) && (bestCP == nil || e.Peer().Bits() > bestCP.Peer().Bits()) {
			bestCP = e
		}
	}
	var npv, cpv *policybpf.PolicyValue
	if bestNP != nil {
		v := decodeValue(bestNP.MapValue(), bestNP.Spill())
		npv = &v
	}
	if bestCP != nil {
		v := decodeValue(bestCP.MapValue(), bestCP.Spill())
		cpv = &v
	}
	return policybpf.EvaluatePolicy(cpv, npv, policybpf.PortPoint(p.Proto, p.Port, policybpf.PortKnown(p.Proto)), strict)
}

func resultText(res policybpf.PolicyResult) string {
	verdict := "DENY"
	if res.Allow {
		verdict = "ALLOW"
	}
	return fmt.Sprintf("%s at %s (%s, object %d, interval %d)", verdict, res.Step, res.Reason, res.Object, res.Interval)
}

func clusterEntryLines(entries []*ClusterMapEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, strings.Join([]string{e.Map(), e.Pod.String(), e.Peer().String(), e.ValueText()}, " "))
	}
	return out
}
