package compile

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
	"github.com/enimasq/enimasq/policymap/netpolicy/inspect"
	"github.com/enimasq/enimasq/policymap/netpolicy/source"
)

// Random scenarios for the property tests: PolicyEndpoints, pods and packets, generated and shrunk.

// Raw input, as generated and as written to the file: the oracle reads
// this, never the parsed objects.
type rawPort struct {
	Protocol string `json:"protocol,omitempty"`
	Port     int    `json:"port,omitempty"`
	EndPort  int    `json:"endPort,omitempty"`
}

type rawRule struct {
	CIDR   string    `json:"cidr"`
	Except []string  `json:"except,omitempty"`
	Ports  []rawPort `json:"ports,omitempty"`
}

type rawPod struct {
	HostIP    string `json:"hostIP,omitempty"`
	PodIP     string `json:"podIP"`
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

type rawPE struct {
	Name string
	// Policy is the parent policy (spec.policyRef) when the object is a
	// slice of another object's policy; "" is a policy of its own.
	Policy    string
	Isolation []string
	Pods      []rawPod
	Ingress   []rawRule
	Egress    []rawRule
}

type scenario struct {
	PEs []rawPE
}

func poolPod(i int, v6 bool) netip.Addr {
	if v6 {
		return netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(i)})
	}
	return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
}

func (s scenario) podIPs() []netip.Addr {
	var out []netip.Addr
	for i := 1; i <= poolSize; i++ {
		out = append(out, poolPod(i, false), poolPod(i, true))
	}
	return out
}

func (s scenario) clone() scenario {
	b, _ := json.Marshal(s)
	var c scenario
	json.Unmarshal(b, &c)
	return c
}

// render writes the scenario as a PolicyEndpointList file.
func (s scenario) render() []byte {
	var items []any
	for _, pe := range s.PEs {
		items = append(items, map[string]any{
			"apiVersion": source.PolicyEndpointAPIVersion,
			"kind":       source.PolicyEndpointKind,
			"metadata":   map[string]string{"name": pe.Name, "namespace": "prop"},
			"spec": map[string]any{
				"policyRef":            map[string]string{"name": pe.policy()},
				"podIsolation":         pe.Isolation,
				"podSelectorEndpoints": pe.Pods,
				"ingress":              pe.Ingress,
				"egress":               pe.Egress,
			},
		})
	}
	b, err := json.MarshalIndent(map[string]any{"apiVersion": "v1", "kind": "List", "items": items}, "", " ")
	if err != nil {
		panic(err)
	}
	return b
}

// policy is the object's parent policy.
func (pe rawPE) policy() string {
	if pe.Policy != "" {
		return pe.Policy
	}
	return pe.Name
}

func (s scenario) parse(t testing.TB) []*endpoints.PolicyEndpoint {
	t.Helper()
	pes, err := source.ParsePolicyEndpoints("scenario.json", s.render())
	if err != nil {
		t.Fatalf("generated file does not parse: %s\n%s", err, s.render())
	}
	return pes
}

// genPrefix returns a prefix of the family in a small address space, so
// that generated prefixes nest and overlap.
func genPrefix(rng *rand.Rand, v6 bool) netip.Prefix {
	if v6 {
		if rng.IntN(10) == 0 {
			return netip.MustParsePrefix("::/0")
		}
		var a [16]byte
		a[0], a[1] = 0xfd, 0
		a[2] = byte(rng.IntN(3))
		a[7] = []byte{0, 1, 0x80, 0xff}[rng.IntN(4)]
		a[15] = []byte{0, 1, 2, 4, 0xfe}[rng.IntN(5)]
		bits := []int{8, 16, 24, 32, 48, 56, 64, 120, 126, 127, 128}[rng.IntN(11)]
		return netip.PrefixFrom(netip.AddrFrom16(a), bits).Masked()
	}
	if rng.IntN(10) == 0 {
		return netip.MustParsePrefix("0.0.0.0/0")
	}
	a := [4]byte{10, byte(rng.IntN(3)), []byte{0, 1, 2, 255}[rng.IntN(4)], []byte{0, 1, 2, 4, 128, 253, 254}[rng.IntN(7)]}
	if rng.IntN(8) == 0 {
		a[0] = 192
	}
	bits := []int{1, 8, 12, 16, 20, 24, 26, 28, 30, 31, 32}[rng.IntN(11)]
	return netip.PrefixFrom(netip.AddrFrom4(a), bits).Masked()
}

// randomIn returns a random address inside p.
func randomIn(rng *rand.Rand, p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		if rng.IntN(2) == 1 {
			b[i/8] |= 0x80 >> (i % 8)
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// lastIn is the last address of p.
func lastIn(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func genExcept(rng *rand.Rand, cidr netip.Prefix) netip.Prefix {
	v6 := cidr.Addr().Is6()
	switch r := rng.IntN(20); {
	case r < 2: // the other family: must be dropped, never encoded
		return genPrefix(rng, !v6)
	case r < 5: // anything: outside, overlapping or covering
		return genPrefix(rng, v6)
	case r < 6: // the cidr itself
		return cidr
	default: // strictly inside
		max := cidr.Addr().BitLen()
		if cidr.Bits() == max {
			return cidr
		}
		bits := cidr.Bits() + 1 + rng.IntN(max-cidr.Bits())
		return netip.PrefixFrom(randomIn(rng, cidr), bits).Masked()
	}
}

var scenarioPorts = []int{53, 80, 81, 443, 1000, 1001, 1005, 65535}

func genRule(rng *rand.Rand, v6 bool) rawRule {
	cidr := genPrefix(rng, v6)
	r := rawRule{CIDR: cidr.String()}
	for range rng.IntN(4) {
		r.Except = append(r.Except, genExcept(rng, cidr).String())
	}
	// At most two port specs per rule and four rules per object and
	// direction, three objects.
	if rng.IntN(4) != 0 {
		for range 1 + rng.IntN(2) {
			var p rawPort
			switch rng.IntN(4) {
			case 0:
				p.Protocol = "UDP"
			case 1:
				p.Protocol = "SCTP"
			case 2:
				p.Protocol = "TCP"
			}
			if rng.IntN(5) != 0 {
				p.Port = scenarioPorts[rng.IntN(len(scenarioPorts))]
				if rng.IntN(3) == 0 && p.Port < 65535 {
					p.EndPort = p.Port + 1 + rng.IntN(10)
					if p.EndPort > 65535 {
						p.EndPort = 65535
					}
				}
			}
			r.Ports = append(r.Ports, p)
		}
	}
	return r
}

// genScenario makes one to three objects. v6 adds IPv6 pods and rules
// (generated for IPv4-only nodes too: they must be inert there).
func genScenario(rng *rand.Rand, v6 bool) scenario {
	var s scenario
	for n := range 1 + rng.IntN(3) {
		pe := rawPE{Name: fmt.Sprintf("pe-%d", n)}
		for _, d := range []string{"Ingress", "Egress"} {
			if rng.IntN(3) != 0 {
				pe.Isolation = append(pe.Isolation, d)
			}
		}
		if n > 0 && rng.IntN(2) == 0 {
			// A slice of an earlier object's policy, as the controller
			// cuts one: the same podIsolation, its own pods and rules.
			first := s.PEs[rng.IntN(n)]
			pe.Policy, pe.Isolation = first.policy(), first.Isolation
		}
		for i := 1; i <= poolSize; i++ {
			if rng.IntN(2) == 0 {
				continue
			}
			name := fmt.Sprintf("pod-%d", i)
			host := "10.0.0.254"
			if i%2 == 0 {
				host = "10.0.0.253"
			}
			if rng.IntN(10) != 0 {
				pe.Pods = append(pe.Pods, rawPod{HostIP: host, PodIP: poolPod(i, false).String(), Name: name, Namespace: "prop"})
			}
			if v6 && rng.IntN(2) == 0 {
				host6 := "fd00::fe"
				if rng.IntN(10) == 0 {
					host6 = host // of the other family: no node entry for this pod IP
				}
				pe.Pods = append(pe.Pods, rawPod{HostIP: host6, PodIP: poolPod(i, true).String(), Name: name, Namespace: "prop"})
			}
		}
		for range rng.IntN(5) {
			pe.Ingress = append(pe.Ingress, genRule(rng, v6 && rng.IntN(2) == 0))
		}
		for range rng.IntN(5) {
			pe.Egress = append(pe.Egress, genRule(rng, v6 && rng.IntN(2) == 0))
		}
		s.PEs = append(s.PEs, pe)
	}
	return s
}

// packet is what the verdict is asked for.
type packet struct {
	Dir   policybpf.Direction
	Pod   netip.Addr
	Peer  netip.Addr
	Proto uint32
	Port  uint16
}

func (p packet) String() string {
	return inspect.VerdictQuery{Direction: p.Dir, Pod: p.Pod, Peer: p.Peer, Protocol: p.Proto, Port: p.Port}.String()
}

// genPackets makes n packets aimed at the scenario's boundaries: the
// first, last and a random address of every prefix, the addresses just
// outside, the node and other pods, and anything at all.
func genPackets(rng *rand.Rand, s scenario, v6 bool, n int) []packet {
	var prefixes [2][]netip.Prefix
	add := func(p netip.Prefix) { prefixes[b2i(p.Addr().Is6())] = append(prefixes[b2i(p.Addr().Is6())], p) }
	ports := []int{1, 65535}
	for _, pe := range s.PEs {
		for _, r := range append(append([]rawRule(nil), pe.Ingress...), pe.Egress...) {
			add(netip.MustParsePrefix(r.CIDR))
			for _, e := range r.Except {
				add(netip.MustParsePrefix(e))
			}
			for _, p := range r.Ports {
				ports = append(ports, p.Port, p.Port-1, p.Port+1, p.EndPort, p.EndPort+1)
			}
		}
	}
	for _, a := range []string{"10.0.0.254", "10.0.0.253", "fd00::fe"} {
		add(netip.PrefixFrom(netip.MustParseAddr(a), netip.MustParseAddr(a).BitLen()))
	}
	out := make([]packet, 0, n)
	for len(out) < n {
		p := packet{Dir: policybpf.Egress, Pod: poolPod(1+rng.IntN(poolSize+1), v6 && rng.IntN(2) == 0)} // pod 5 is never selected
		if rng.IntN(2) == 0 {
			p.Dir = policybpf.Ingress
		}
		fam := b2i(p.Pod.Is6())
		switch r := rng.IntN(10); {
		case r < 8 && len(prefixes[fam]) > 0:
			pfx := prefixes[fam][rng.IntN(len(prefixes[fam]))]
			switch rng.IntN(5) {
			case 0:
				p.Peer = pfx.Addr()
			case 1:
				p.Peer = lastIn(pfx)
			case 2:
				p.Peer = pfx.Addr().Prev()
			case 3:
				p.Peer = lastIn(pfx).Next()
			default:
				p.Peer = randomIn(rng, pfx)
			}
		case r < 9:
			p.Peer = poolPod(1+rng.IntN(poolSize), p.Pod.Is6())
		default:
			p.Peer = randomIn(rng, genPrefix(rng, p.Pod.Is6()))
		}
		if !p.Peer.IsValid() {
			continue // before the first or after the last address
		}
		switch r := rng.IntN(10); {
		case r < 4:
			p.Proto = policybpf.ProtocolTCP
		case r < 7:
			p.Proto = policybpf.ProtocolUDP
		case r < 9:
			p.Proto = policybpf.ProtocolSCTP
		default:
			p.Proto = 1
			if p.Pod.Is6() {
				p.Proto = 58
			}
		}
		if policybpf.PortKnown(p.Proto) {
			port := ports[rng.IntN(len(ports))]
			if rng.IntN(10) == 0 {
				port = 1 + rng.IntN(65535)
			}
			if port < 1 || port > 65535 {
				continue
			}
			p.Port = uint16(port)
		}
		out = append(out, p)
	}
	return out
}

// smaller returns the scenarios with one element less: an object, a pod,
// a rule, an except, a port or an isolation.
func (s scenario) smaller() []scenario {
	var out []scenario
	edit := func(fn func(c *scenario)) {
		c := s.clone()
		fn(&c)
		out = append(out, c)
	}
	for i, pe := range s.PEs {
		edit(func(c *scenario) { c.PEs = append(c.PEs[:i], c.PEs[i+1:]...) })
		if pe.Policy != "" {
			edit(func(c *scenario) { c.PEs[i].Policy = "" })
		}
		for j := range pe.Pods {
			edit(func(c *scenario) { c.PEs[i].Pods = append(c.PEs[i].Pods[:j], c.PEs[i].Pods[j+1:]...) })
		}
		for j := range pe.Isolation {
			edit(func(c *scenario) { c.PEs[i].Isolation = append(c.PEs[i].Isolation[:j], c.PEs[i].Isolation[j+1:]...) })
		}
		for _, dir := range []func(c *scenario) *[]rawRule{
			func(c *scenario) *[]rawRule { return &c.PEs[i].Ingress },
			func(c *scenario) *[]rawRule { return &c.PEs[i].Egress },
		} {
			rules := *dir(&s)
			for j, r := range rules {
				edit(func(c *scenario) { rs := dir(c); *rs = append((*rs)[:j], (*rs)[j+1:]...) })
				for k := range r.Except {
					edit(func(c *scenario) { e := &(*dir(c))[j].Except; *e = append((*e)[:k], (*e)[k+1:]...) })
				}
				for k := range r.Ports {
					edit(func(c *scenario) { ps := &(*dir(c))[j].Ports; *ps = append((*ps)[:k], (*ps)[k+1:]...) })
				}
			}
		}
	}
	return out
}

// shrink removes elements from s while the packet still fails.
func shrink(s scenario, fails func(scenario) bool) scenario {
	for progress := true; progress; {
		progress = false
		for _, c := range s.smaller() {
			if fails(c) {
				s, progress = c, true
				break
			}
		}
	}
	return s
}
