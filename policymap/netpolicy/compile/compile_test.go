package compile

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
	"github.com/enimasq/enimasq/policymap/netpolicy/source"
)

func mustParse(t testing.TB, yamls ...string) []*endpoints.PolicyEndpoint {
	t.Helper()
	var out []*endpoints.PolicyEndpoint
	for _, y := range yamls {
		pes, err := source.ParsePolicyEndpoints("test.yaml", []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pes...)
	}
	return out
}

// entryLines renders entries as "map pod peer ports [error]" lines.
func entryLines(entries []*PolicyMapEntry) []string {
	var out []string
	for _, e := range entries {
		l := strings.Join([]string{e.Map(), e.Pod.String(), e.Peer().String(), e.ValueText()}, " ")
		if e.EncodeError() != "" {
			l += " ERROR " + e.EncodeError()
		}
		out = append(out, l)
	}
	return out
}

func pe(name, spec string) string {
	return "apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata: {name: " + name + ", namespace: ns}\nspec:\n  policyRef: {name: " + name + "}\n" + spec
}

// samplePath is the sample of the end-to-end tests.
const samplePath = "../../../test/testdata/samples/policyendpoint-v6-except.yaml"

func TestCompilePod(t *testing.T) {
	sample, err := os.ReadFile(samplePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pod  string
		pes  []string
		want []string
	}{
		{"sample on the v4 pod", "10.130.100.133", []string{string(sample)}, []string{
			"enimasq_egress_v4 10.130.100.133 0.0.0.0/0 deny",
			"enimasq_egress_v4 10.130.100.133 10.0.0.0/8 udp/53",
			"enimasq_egress_v4 10.130.100.133 10.130.0.0/16 deny",
			"enimasq_egress_v4 10.130.100.133 10.130.0.10/32 any",
			"enimasq_egress_v4 10.130.100.133 10.130.112.20/32 tcp/8080",
			"enimasq_ingress_v4 10.130.100.133 0.0.0.0/0 not isolated",
		}},
		{"a pod no object selects", "10.130.100.134", []string{string(sample)}, nil},
		{"not isolated: allow-all, no host entry needed", "10.0.0.5", []string{pe("a", "  podIsolation: []\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n")}, []string{
			"enimasq_egress_v4 10.0.0.5 0.0.0.0/0 not isolated",
			"enimasq_ingress_v4 10.0.0.5 0.0.0.0/0 not isolated",
		}},
		{"isolated without rules: deny but the node", "fd00::5", []string{pe("a", "  podIsolation: [Ingress, Egress]\n  podSelectorEndpoints: [{hostIP: 'fd00::1', podIP: 'fd00::5'}]\n")}, []string{
			"enimasq_egress_v6 fd00::5 ::/0 deny",
			"enimasq_egress_v6 fd00::5 fd00::1/128 any",
			"enimasq_ingress_v6 fd00::5 ::/0 deny",
			"enimasq_ingress_v6 fd00::5 fd00::1/128 any",
		}},
		{"the node IP wins over an except", "10.0.0.5", []string{pe("a", "  podIsolation: [Ingress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  ingress: [{cidr: 10.0.0.0/8, except: [10.0.0.0/24]}, {cidr: 10.0.0.1/32, ports: [{port: 1}]}]\n")}, []string{
			"enimasq_egress_v4 10.0.0.5 0.0.0.0/0 not isolated",
			"enimasq_ingress_v4 10.0.0.5 0.0.0.0/0 deny",
			"enimasq_ingress_v4 10.0.0.5 10.0.0.0/8 any",
			"enimasq_ingress_v4 10.0.0.5 10.0.0.0/24 deny",
			"enimasq_ingress_v4 10.0.0.5 10.0.0.1/32 any",
		}},
		{"rules of a direction the object does not isolate are ignored", "10.0.0.5", []string{
			pe("a", "  podIsolation: [Ingress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  egress: [{cidr: 10.0.0.0/8}]\n"),
		}, []string{
			"enimasq_egress_v4 10.0.0.5 0.0.0.0/0 not isolated",
			"enimasq_ingress_v4 10.0.0.5 0.0.0.0/0 deny",
			"enimasq_ingress_v4 10.0.0.5 10.0.0.1/32 any",
		}},
		{"union over objects, excepts bound to their rule, ports merged", "10.0.0.5", []string{
			pe("a", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  egress:\n  - {cidr: 0.0.0.0/0, except: [10.0.0.0/8], ports: [{port: 443}, {port: 80}, {port: 81, endPort: 90}]}\n  - {cidr: 10.2.0.0/16, ports: [{protocol: UDP}, {protocol: UDP, port: 53}]}\n"),
			pe("b", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}, {hostIP: 10.0.0.1, podIP: 10.0.0.6}]\n  egress:\n  - {cidr: 10.0.0.0/8, except: [10.2.3.0/24], ports: [{port: 91, endPort: 100}, {protocol: SCTP, port: 9}]}\n"),
		}, []string{
			"enimasq_egress_v4 10.0.0.5 0.0.0.0/0 tcp/80-90,tcp/443",
			"enimasq_egress_v4 10.0.0.5 10.0.0.0/8 tcp/91-100,sctp/9",
			"enimasq_egress_v4 10.0.0.5 10.0.0.1/32 any",
			"enimasq_egress_v4 10.0.0.5 10.2.0.0/16 tcp/91-100,udp/*,sctp/9",
			"enimasq_egress_v4 10.0.0.5 10.2.3.0/24 udp/*",
			"enimasq_ingress_v4 10.0.0.5 0.0.0.0/0 not isolated",
		}},
		{"a rule without ports allows every protocol", "10.0.0.5", []string{
			pe("a", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  egress: [{cidr: 10.0.0.0/8, ports: [{port: 80}]}, {cidr: 10.0.0.0/8}]\n"),
		}, []string{
			"enimasq_egress_v4 10.0.0.5 0.0.0.0/0 deny",
			"enimasq_egress_v4 10.0.0.5 10.0.0.0/8 any",
			"enimasq_egress_v4 10.0.0.5 10.0.0.1/32 any",
			"enimasq_ingress_v4 10.0.0.5 0.0.0.0/0 not isolated",
		}},
		{"v4 items are not used for the v6 pod IP", "fd00::5", []string{string(sample), pe("dual", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5, name: w}, {hostIP: 'fd00::1', podIP: 'fd00::5', name: w}]\n  egress: [{cidr: 10.0.0.0/8}, {cidr: 'fd00::/8', except: ['fd00::/16'], ports: [{port: 1}]}]\n")}, []string{
			"enimasq_egress_v6 fd00::5 ::/0 deny",
			"enimasq_egress_v6 fd00::5 fd00::/8 tcp/1",
			"enimasq_egress_v6 fd00::5 fd00::/16 deny",
			"enimasq_egress_v6 fd00::5 fd00::1/128 any",
			"enimasq_ingress_v6 fd00::5 ::/0 not isolated",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := entryLines(CompilePod(netip.MustParseAddr(tc.pod), mustParse(t, tc.pes...)))
			if !slices.Equal(got, tc.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestCompileAnyNumberOfPortEntries: a rule's ports are compiled whatever
// their number (the AWS agent truncates at 24): the value allows exactly
// those, its intervals past the inline ones in chunks.
func TestCompileAnyNumberOfPortEntries(t *testing.T) {
	for _, n := range []int{24, 30, 1000} {
		var ports []string
		for i := range n {
			ports = append(ports, "{port: "+itoa(1000+2*i)+"}")
		}
		pes := mustParse(t, pe("a", "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  egress:\n"+
			"  - {cidr: 10.0.0.0/8, ports: ["+strings.Join(ports, ", ")+"]}\n"))
		var key *PolicyMapEntry
		for _, e := range CompilePod(netip.MustParseAddr("10.0.0.5"), pes) {
			if e.Map() == policybpf.PolicyEgressV4MapName && e.Peer() == netip.MustParsePrefix("10.0.0.0/8") {
				key = e
			}
		}
		if key == nil || key.EncodeError() != "" {
			t.Fatalf("%d ports: no 10.0.0.0/8 key, or an error: %v", n, key)
		}
		chunks := map[string][]byte{}
		for _, c := range key.Spill() {
			chunks[string(c.Key)] = c.Value
		}
		if (n > policybpf.PolicyInlineIntervals) != (len(chunks) > 0) || (len(chunks) > 0) != (key.SpillMap() == policybpf.PolicyChunksMapName) {
			t.Errorf("%d ports: %d chunks in %q", n, len(chunks), key.SpillMap())
		}
		v, err := policybpf.UnmarshalPolicyValue(key.MapValue(), func(k []byte) ([]byte, error) { return chunks[string(k)], nil })
		if err != nil {
			t.Fatal(err)
		}
		for port := uint16(990); port < uint16(1000+2*n+10); port++ {
			want := port >= 1000 && port < uint16(1000+2*n) && port%2 == 0
			if got := v.Search(policybpf.PortPoint(policybpf.ProtocolTCP, port, true)) >= 0; got != want {
				t.Fatalf("%d ports: tcp/%d allowed=%t, want %t", n, port, got, want)
			}
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestMergePorts(t *testing.T) {
	tcp := func(p, e uint16) endpoints.Port {
		return endpoints.Port{Protocol: policybpf.ProtocolTCP, Port: p, EndPort: e}
	}
	udp := func(p, e uint16) endpoints.Port {
		return endpoints.Port{Protocol: policybpf.ProtocolUDP, Port: p, EndPort: e}
	}
	for _, tc := range []struct {
		in   []endpoints.Port
		want string
	}{
		{nil, "deny"},
		{[]endpoints.Port{tcp(80, 0), tcp(80, 0)}, "tcp/80"},
		{[]endpoints.Port{tcp(80, 0), tcp(81, 0), tcp(82, 90)}, "tcp/80-90"},
		{[]endpoints.Port{tcp(82, 90), tcp(80, 0)}, "tcp/80,tcp/82-90"},
		{[]endpoints.Port{tcp(1, 100), tcp(50, 60), tcp(100, 200), tcp(202, 0)}, "tcp/1-200,tcp/202"},
		{[]endpoints.Port{udp(53, 0), tcp(0, 0), tcp(80, 0)}, "tcp/*,udp/53"},
		{[]endpoints.Port{{Protocol: policybpf.ProtocolSCTP, Port: 9}, udp(53, 0), tcp(1, 65535)}, "tcp/1-65535,udp/53,sctp/9"},
	} {
		v := policybpf.AllowValue(mergePorts(nil, tc.in)...)
		if got := v.String(); got != tc.want {
			t.Errorf("mergePorts(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestCompileIsDeterministic: the same objects, with rules, excepts, ports
// and objects in any order, give byte-identical entries, run after run.
func TestCompileIsDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		s := genScenario(rng, true)
		pes := s.parse(t)
		pods := s.podIPs()
		base := compileAll(pods, pes)
		for range 5 {
			shuffled := shuffleObjects(rng, pes)
			again := compileAll(pods, shuffled)
			if len(again) != len(base) {
				t.Fatalf("scenario %d: %d entries, then %d", i, len(base), len(again))
			}
			for j := range base {
				a, b := base[j], again[j]
				if a.Map() != b.Map() || !bytes.Equal(a.MapKey(), b.MapKey()) || !bytes.Equal(a.MapValue(), b.MapValue()) || a.EncodeError() != b.EncodeError() {
					t.Fatalf("scenario %d entry %d: %v then %v", i, j, a.TableRow(), b.TableRow())
				}
			}
		}
	}
}

func compileAll(pods []netip.Addr, pes []*endpoints.PolicyEndpoint) []*PolicyMapEntry {
	var out []*PolicyMapEntry
	for _, pod := range pods {
		out = append(out, CompilePod(pod, pes)...)
	}
	return out
}

// shuffleObjects returns deep enough copies of pes with objects, rules,
// excepts and ports in random order.
func shuffleObjects(rng *rand.Rand, pes []*endpoints.PolicyEndpoint) []*endpoints.PolicyEndpoint {
	out := make([]*endpoints.PolicyEndpoint, len(pes))
	for i, pe := range pes {
		c := *pe
		c.Ingress, c.Egress = shuffleRules(rng, pe.Ingress), shuffleRules(rng, pe.Egress)
		c.Pods = slices.Clone(pe.Pods)
		rng.Shuffle(len(c.Pods), func(i, j int) { c.Pods[i], c.Pods[j] = c.Pods[j], c.Pods[i] })
		out[i] = &c
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func shuffleRules(rng *rand.Rand, rules []endpoints.Rule) []endpoints.Rule {
	out := slices.Clone(rules)
	for i := range out {
		out[i].Except = slices.Clone(out[i].Except)
		out[i].Ports = slices.Clone(out[i].Ports)
		rng.Shuffle(len(out[i].Except), func(a, b int) { out[i].Except[a], out[i].Except[b] = out[i].Except[b], out[i].Except[a] })
		rng.Shuffle(len(out[i].Ports), func(a, b int) { out[i].Ports[a], out[i].Ports[b] = out[i].Ports[b], out[i].Ports[a] })
	}
	rng.Shuffle(len(out), func(a, b int) { out[a], out[b] = out[b], out[a] })
	return out
}

// TestPortCoverMatchesMergePorts: the counted cover of random rules, added
// and removed in random order, reads as mergePorts of the live rules'
// ports: same entries, same count.
func TestPortCoverMatchesMergePorts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	protos := []uint32{policybpf.ProtocolTCP, policybpf.ProtocolUDP, policybpf.ProtocolSCTP}
	for range 300 {
		rules := make([]*endpoints.Rule, 1+rng.IntN(12))
		for i := range rules {
			r := &endpoints.Rule{}
			for range rng.IntN(4) {
				p := endpoints.Port{Protocol: protos[rng.IntN(3)]}
				if rng.IntN(8) != 0 {
					p.Port = uint16(1 + rng.IntN(40))
					if rng.IntN(3) == 0 {
						p.EndPort = p.Port + uint16(1+rng.IntN(10))
					}
					if rng.IntN(20) == 0 {
						p.Port, p.EndPort = 65530, 65535
					}
				}
				r.Ports = append(r.Ports, p)
			}
			rules[i] = r
		}
		cover := newPortCover(rules)
		live := make([]int32, len(rules))
		for range 40 {
			r := rng.IntN(len(rules))
			if live[r] > 0 && rng.IntN(2) == 0 {
				live[r]--
				cover.addRule(r, -1)
			} else {
				live[r]++
				cover.addRule(r, 1)
			}
			var ports []endpoints.Port
			for i, n := range live {
				for range n {
					ports = append(ports, rules[i].Ports...)
				}
			}
			want := mergePorts(nil, ports)
			got := cover.appendEntries(nil)
			if !slices.Equal(got, want) || cover.count() != len(want) {
				t.Fatalf("live %v of %v: cover %v (count %d), mergePorts %v", live, rules, got, cover.count(), want)
			}
		}
	}
}
