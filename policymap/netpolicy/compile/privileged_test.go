package compile

import (
	"bytes"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/inspect"
)

// TestPrivilegedPolicyProgramMatchesOracle is the property test on the real
// datapath: random policies go through the table, the compiler and the
// reconciler into the kernel maps, and the verdict program, run with
// BPF_PROG_TEST_RUN on random packets, must agree with the direct
// evaluation of the NetworkPolicy semantics. On a failure the seed and a
// minimal case (shrunk through the same pipeline) are printed.
func TestPrivilegedPolicyProgramMatchesOracle(t *testing.T) {
	celltest.RequireRoot(t)
	seed := propertySeed(t)
	scenarios, packets := 400, 40
	if testing.Short() {
		scenarios = 30
	}
	for _, node := range []nodeconfig.Config{{EnableIPv4: true}, {EnableIPv4: true, EnableIPv6: true}} {
		name := "ipv4-only"
		if node.EnableIPv6 {
			name = "dual-stack"
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(b2i(node.EnableIPv6))))
			h := startPolicyHarness(t, harnessOptions{node: node})
			prog := h.program()
			apply := func(s scenario) {
				h.setEndpoints(s.parse(t))
				h.waitConverged(compileScenario(t, s, node))
			}
			checked := 0
			for i := range scenarios {
				s := genScenario(rng, true)
				apply(s)
				for _, p := range genPackets(rng, s, true, packets) {
					checked++
					want := s.oracleAllows(h.node, p)
					res := runPacket(t, prog, p)
					if res.Allow == want {
						continue
					}
					min := shrink(s, func(c scenario) bool {
						apply(c)
						return runPacket(t, prog, p).Allow != c.oracleAllows(h.node, p)
					})
					apply(min)
					t.Fatalf("seed %d, %s node, scenario %d: packet %s: oracle allows=%t, the program says %+v\nminimal case:\n%s\nkernel maps:\n%s",
						seed, name, i, p, want, runPacket(t, prog, p), min.render(), mustList(t, h.kernelMaps()))
				}
			}
			t.Logf("%d packets on %d random policies: the program on the reconciled maps agrees with the oracle", checked, scenarios)
		})
	}
}

func mustList(t testing.TB, maps map[string]*ebpf.Map) string {
	out, err := inspect.ListPolicyMaps(maps, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrivilegedPolicyChurnWhileFailing: a destination changes in the
// PolicyEndpoint (a pod IP becomes its /24 but that IP: nested keys, so a
// new version, edit.go) while another entry of the pod's new version
// fails in the kernel. The new version never comes into force: the pod keeps its
// old one whole (the old destination allowed, the new one not), its row
// names the failure, and the kernel's verdicts are the old version's. Once
// the fault goes, the new version comes into force whole and the old
// one's keys go.
func TestPrivilegedPolicyChurnWhileFailing(t *testing.T) {
	spec := func(dst string) string {
		return "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n" +
			"  egress:\n  - {" + dst + ", ports: [{port: 80}]}\n  - {cidr: 172.16.0.0/12, ports: [{protocol: UDP, port: 53}]}\n"
	}
	pod := netip.MustParseAddr("10.0.0.5")
	failing, _ := bpf.EncodePolicyKey(pod, netip.MustParsePrefix("172.16.0.0/12"))
	h := startPolicyHarness(t, harnessOptions{})
	prog := h.program()
	verdict := func(peer string) bool {
		return runPacket(t, prog, packet{Dir: policybpf.Egress, Pod: pod, Peer: netip.MustParseAddr(peer), Proto: 6, Port: 80}).Allow
	}

	before := mustParse(t, pe("client", spec("cidr: 10.2.0.7/32")))
	h.setEndpoints(before)
	h.waitConverged(CompilePod(pod, before))
	if !verdict("10.2.0.7") || verdict("10.2.0.8") {
		t.Fatal("the first version is not in force")
	}

	// The new version's 172.16/12 key is refused (whatever its version).
	h.ops.Faults().SetFaultFunc(func(_ string, key []byte) error {
		if bytes.Equal(bpf.PolicyKeyVersionless(key), failing) {
			return errors.New("refused by the test")
		}
		return nil
	})
	after := mustParse(t, pe("client", spec("cidr: 10.2.0.0/24, except: [10.2.0.7/32]")))
	h.setEndpoints(after)
	h.waitVersionFailing(pod)
	row, _, _ := h.versionsTable.Get(h.db.ReadTxn(), PodVersionsIndex.Query(pod))
	if msg := strings.Join(row.TableRow(), " "); !strings.Contains(msg, "refused by the test") || !strings.Contains(msg, "172.16.0.0/12") {
		t.Errorf("the versions row does not name the failure: %s", msg)
	}
	// The old version stays in force, whole: the kernel's verdicts are
	// its, whatever of the new one is written.
	if !verdict("10.2.0.7") || verdict("10.2.0.8") {
		t.Errorf("a version that is not whole came into force:\n%s", mustList(t, h.kernelMaps()))
	}

	// The fault goes: the new version comes into force, whole.
	h.ops.Faults().SetFaultFunc(nil)
	h.waitConverged(CompilePod(pod, after))
	if verdict("10.2.0.7") || !verdict("10.2.0.8") {
		t.Errorf("the new version is not in force:\n%s", mustList(t, h.kernelMaps()))
	}
}

// byteSlices returns the elements of a slice of byte arrays (a batch of
// keys) as byte slices.
func byteSlices(keys any) [][]byte {
	v := reflect.ValueOf(keys)
	out := make([][]byte, v.Len())
	for i := range out {
		e := v.Index(i)
		b := make([]byte, e.Len())
		reflect.Copy(reflect.ValueOf(b), e)
		out[i] = b
	}
	return out
}

// statusOf is the status kind of the entry with key, "" if absent.
// TestPrivilegedPolicyIdenticalBytes: identical input, in any order, gives
// byte-identical kernel maps, run after run (each run a fresh agent on a
// fresh bpffs).
func TestPrivilegedPolicyIdenticalBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	s := genScenario(rng, true)
	for len(s.PEs) < 3 {
		s = genScenario(rng, true)
	}
	node := nodeconfig.Config{EnableIPv4: true, EnableIPv6: true}
	var first []byte
	for run := range 3 {
		h := startPolicyHarness(t, harnessOptions{node: node})
		h.setEndpoints(shuffleObjects(rng, s.parse(t)))
		h.waitConverged(compileScenario(t, s, node))
		got := h.rawKernelBytes()
		h.stop()
		if run == 0 {
			first = got
			continue
		}
		if !bytes.Equal(got, first) {
			t.Fatalf("run %d: kernel bytes differ:\n%s\nfirst run:\n%s", run, got, first)
		}
	}
	if len(first) == 0 {
		t.Fatal("nothing programmed")
	}
}

// TestPrivilegedPolicyNoPruneBeforeSourceInitialized: a restart finds the
// maps of the previous run. Until policy-endpoints is initialized (its
// source has loaded the files), nothing is pruned, even with a short prune
// interval; once it is, the maps hold exactly the new desired state.
func TestPrivilegedPolicyNoPruneBeforeSourceInitialized(t *testing.T) {
	pod := netip.MustParseAddr("10.0.0.5")
	stale, _ := bpf.EncodePolicyKey(pod, netip.MustParsePrefix("10.9.0.0/16"))
	h := startPolicyHarness(t, harnessOptions{
		args: []string{"--bpf-map-refresh-interval=20ms"},
		beforeStart: func(dir string) {
			m, err := bpf.OpenPinned(slog.New(slog.DiscardHandler), policybpf.PolicyMapSpec(policybpf.Egress, bpf.IPv4, policybpf.PolicyDefaultMaxEntries), dir)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.Put(stale, anyPorts.bytes); err != nil {
				t.Fatal(err)
			}
		},
	})
	time.Sleep(300 * time.Millisecond) // 15 prune intervals
	if kernel := mustList(t, h.kernelMaps()); !strings.Contains(kernel, "10.9.0.0/16 any") {
		t.Fatalf("the previous run's entries were pruned before the source was initialized:\n%s", kernel)
	}
	if ok, _ := h.entries.Initialized(h.db.ReadTxn()); ok {
		t.Fatal("policy-map-entries is initialized before policy-endpoints")
	}

	pes := mustParse(t, pe("a", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n"))
	h.setEndpoints(pes)
	deadline := time.Now().Add(10 * time.Second)
	for strings.Contains(mustList(t, h.kernelMaps()), "10.9.0.0/16") {
		if time.Now().After(deadline) {
			t.Fatal("the stale entry is never pruned")
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.waitConverged(CompilePod(pod, pes))
}

// TestPrivilegedPolicyRestartRemovesRestoredVersion: a restart moves each
// pod from the version an earlier run left in force to a new one. The old
// version's keys have no row in this run: they must still leave the maps
// once the new version is in force, without waiting for the periodic
// prune (an hour away here), which the first prune, run before the switch,
// cannot do (the old version was in force then).
func TestPrivilegedPolicyRestartRemovesRestoredVersion(t *testing.T) {
	pes := mustParse(t, pe("a", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n"+
		"  egress:\n  - cidr: 10.1.0.0/16\n    ports: [{protocol: TCP, port: 80}]\n"))
	want := CompilePod(netip.MustParseAddr("10.0.0.5"), pes)
	args := []string{"--bpf-map-refresh-interval=1h"}
	first := startPolicyHarness(t, harnessOptions{args: args})
	first.setEndpoints(pes)
	first.waitConverged(want)
	first.stop()

	for range 3 {
		h := startPolicyHarness(t, harnessOptions{node: first.node, args: args})
		h.setEndpoints(pes)
		h.waitConverged(want) // one version's keys, not two
		h.stop()
	}
}
