package compile

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// clusterKernel is the real verdict program on kernel maps of its own
// (unpinned): the four NetworkPolicy maps, the four cluster maps, both
// chunk maps and the mode map, filled with compiled entries by fill.
type clusterKernel struct {
	tb   testing.TB
	maps map[string]*ebpf.Map
	prog *policybpf.PolicyProgram
}

const clusterKernelMaxEntries = 1 << 14

func newClusterKernel(tb testing.TB) *clusterKernel {
	tb.Helper()
	celltest.RequireRoot(tb)
	k := &clusterKernel{tb: tb, maps: map[string]*ebpf.Map{}}
	var specs []*ebpf.MapSpec
	for _, d := range []policybpf.Direction{policybpf.Egress, policybpf.Ingress} {
		for _, f := range []bpf.Family{bpf.IPv4, bpf.IPv6} {
			specs = append(specs, policybpf.PolicyMapSpec(d, f, clusterKernelMaxEntries), policybpf.ClusterMapSpec(d, f, clusterKernelMaxEntries))
		}
	}
	specs = append(specs, policybpf.ChunkMapSpec(policybpf.PolicyChunksMapName, clusterKernelMaxEntries),
		policybpf.ChunkMapSpec(policybpf.ClusterChunksMapName, clusterKernelMaxEntries))
	mode, err := policybpf.PolicyStateSpec(policybpf.PolicyModeMapName)
	if err != nil {
		tb.Fatal(err)
	}
	specs = append(specs, mode)
	for _, spec := range specs {
		spec = spec.Copy()
		spec.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(spec)
		if err != nil {
			tb.Fatalf("create %s: %v", spec.Name, err)
		}
		tb.Cleanup(func() { m.Close() })
		k.maps[spec.Name] = m
	}
	if k.prog, err = policybpf.LoadPolicyProgram(k.maps); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { k.prog.Close() })
	return k
}

// fill makes the maps hold exactly the entries (and their chunks), and
// sets the mode.
func (k *clusterKernel) fill(np []*PolicyMapEntry, cp []*ClusterMapEntry, strict bool) {
	k.tb.Helper()
	for name, m := range k.maps {
		if name == policybpf.PolicyModeMapName {
			continue
		}
		var keys [][]byte
		key, value := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
		iter := m.Iterate()
		for iter.Next(&key, &value) {
			keys = append(keys, slices.Clone(key))
		}
		if err := iter.Err(); err != nil {
			k.tb.Fatalf("iterate %s: %v", name, err)
		}
		for _, key := range keys {
			if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				k.tb.Fatalf("delete from %s: %v", name, err)
			}
		}
	}
	put := func(mapName string, key, value []byte) {
		if err := k.maps[mapName].Put(key, value); err != nil {
			k.tb.Fatalf("put into %s: %v", mapName, err)
		}
	}
	for _, e := range np {
		if e.EncodeError() != "" {
			k.tb.Fatalf("entry %s %s %s: %s", e.Map(), e.Pod, e.Peer(), e.EncodeError())
		}
		for _, c := range e.Spill() {
			put(policybpf.PolicyChunksMapName, c.Key, c.Value)
		}
		put(e.Map(), e.MapKey(), e.MapValue())
	}
	for _, e := range cp {
		if e.EncodeError() != "" {
			k.tb.Fatalf("entry %s %s %s: %s", e.Map(), e.Pod, e.Peer(), e.EncodeError())
		}
		for _, c := range e.Spill() {
			put(policybpf.ClusterChunksMapName, c.Key, c.Value)
		}
		put(e.Map(), e.MapKey(), e.MapValue())
	}
	mode := policybpf.PolicyModeStandard
	if strict {
		mode = policybpf.PolicyModeStrict
	}
	if err := policybpf.SetPolicyMode(k.maps[policybpf.PolicyModeMapName], mode); err != nil {
		k.tb.Fatal(err)
	}
}

// TestPrivilegedClusterProgramMatchesOracle is the cluster property test
// on the real datapath: random PolicyEndpoints and ClusterPolicyEndpoints
// are compiled into kernel maps, and the verdict program, run with
// BPF_PROG_TEST_RUN on random packets, must give the reference evaluator's
// verdict, step and deciding object, in standard and strict mode. On a
// failure the seed and a minimal case (shrunk on the program) are printed,
// with what policybpf.EvaluatePolicy says on the same entries.
func TestPrivilegedClusterProgramMatchesOracle(t *testing.T) {
	celltest.RequireRoot(t)
	seed := propertySeed(t)
	scenarios, packets := 1500, 40
	if testing.Short() {
		scenarios = 40
	}
	k := newClusterKernel(t)
	for _, node := range []nodeconfig.Config{{EnableIPv4: true}, {EnableIPv4: true, EnableIPv6: true}} {
		name := "ipv4-only"
		if node.EnableIPv6 {
			name = "dual-stack"
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0xc2+uint64(b2i(node.EnableIPv6))))
			checked := 0
			for i := range scenarios {
				strict := i%3 == 2
				s := genClusterScenario(rng, true)
				np, cp := compileClusterScenario(t, s, node)
				k.fill(np, cp, strict)
				for _, p := range genClusterPackets(rng, s, true, packets) {
					want := s.clusterOracle(node, strict, p)
					checked++
					got := runPacket(t, k.prog, p)
					if want.agrees(got) {
						continue
					}
					min := shrinkCluster(s, func(c clusterScenario) bool {
						np, cp := compileClusterScenario(t, c, node)
						k.fill(np, cp, strict)
						return !c.clusterOracle(node, strict, p).agrees(runPacket(t, k.prog, p))
					})
					np, cp := compileClusterScenario(t, min, node)
					k.fill(np, cp, strict)
					t.Fatalf("seed %d, %s node, scenario %d, strict %t: packet %s: oracle %s, the program %s\n"+
						"minimal case (oracle %s, the program %s, bpf.EvaluatePolicy %s):\n%s\nNetworkPolicy entries:\n%s\ncluster entries:\n%s",
						seed, name, i, strict, p, want, resultText(got),
						min.clusterOracle(node, strict, p), resultText(runPacket(t, k.prog, p)), resultText(evalClusterEntries(np, cp, strict, p)),
						min.render(), strings.Join(entryLines(np), "\n"), strings.Join(clusterEntryLines(cp), "\n"))
				}
			}
			t.Logf("%d packets on %d random policies: the program agrees with the oracle", checked, scenarios)
		})
	}
}

// TestPrivilegedClusterProgramStrictSelectedPod is
// TestClusterOracleStrictSelectedPod on the real program: in strict mode,
// the direction a pod's PolicyEndpoint does not isolate is allowed.
func TestPrivilegedClusterProgramStrictSelectedPod(t *testing.T) {
	k := newClusterKernel(t)
	node := nodeconfig.Config{EnableIPv4: true}
	s := clusterScenario{NP: scenario{PEs: []rawPE{{
		Name: "ingress-only", Isolation: []string{"Ingress"},
		Pods: []rawPod{{PodIP: "10.0.0.2", HostIP: "10.0.0.253"}},
	}}}}
	np, cp := compileClusterScenario(t, s, node)
	k.fill(np, cp, true)
	p := packet{Dir: policybpf.Egress, Pod: poolPod(2, false), Peer: poolPod(3, false), Proto: policybpf.ProtocolTCP, Port: 443}
	if got := runPacket(t, k.prog, p); !got.Allow {
		t.Errorf("strict mode, %s (egress not isolated by the pod's PolicyEndpoint): the program %s, want ALLOW", p, resultText(got))
	}
}
