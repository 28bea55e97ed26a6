package dnsproxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Chain is the chain of the mangle table that holds the TPROXY rules,
// jumped to first from PREROUTING.
const Chain = "ENIMASQ-DNS"

// dnsPort is where the redirected pods' DNS goes.
const dnsPort = 53

// family is what differs between the IPv4 and IPv6 halves of the redirect.
type family struct {
	name     string
	v6       bool
	iptables string // the listing tool
	restore  string // the atomic writer
	nl       int    // netlink family
	onIP     string // TPROXY's --on-ip: where it looks for the proxy's socket
	all      netip.Prefix
}

func families() []family {
	return []family{
		{name: "IPv4", iptables: "iptables", restore: "iptables-restore", nl: unix.AF_INET,
			onIP: "127.0.0.1", all: netip.MustParsePrefix("0.0.0.0/0")},
		{name: "IPv6", v6: true, iptables: "ip6tables", restore: "ip6tables-restore", nl: unix.AF_INET6,
			onIP: "::1", all: netip.MustParsePrefix("::/0")},
	}
}

// chainRules are the rules of Chain for the pods (of the family, sorted),
// written as `iptables -S` lists them: for each pod, UDP and TCP to port
// 53 go to the proxy's port. TPROXY does not rewrite the packet: it finds
// the proxy's socket bound to the wildcard (looking up --on-ip:--on-port),
// hands the packet to it and sets the mark, by which the ip rule routes
// the packet to the local table (a packet for the resolver's address is
// then delivered locally, not forwarded). The packet keeps the resolver's
// address, so no route_localnet or martian check meets a loopback
// destination: --on-ip only says where to look for the socket.
func chainRules(f family, pods []netip.Addr, port uint16, mark uint32) []string {
	var rules []string
	for _, pod := range pods {
		for _, proto := range []string{"udp", "tcp"} {
			rules = append(rules, fmt.Sprintf("-A %s -s %s -p %s -m %s --dport %d -j TPROXY --on-port %d --on-ip %s --tproxy-mark %#x/%#x",
				Chain, netip.PrefixFrom(pod, pod.BitLen()), proto, proto, dnsPort, port, f.onIP, mark, mark))
		}
	}
	return rules
}

// mangleState is what the mangle table holds of the redirect, from
// `iptables -t mangle -S`.
type mangleState struct {
	chain bool     // Chain exists
	rules []string // its rules, as listed
	jumps []int    // the positions (from 1) of the jumps to it in PREROUTING
}

// parseMangle reads the listing of the mangle table.
func parseMangle(listing string) mangleState {
	var s mangleState
	pos := 0
	for line := range strings.Lines(listing) {
		line = strings.TrimSpace(line)
		switch {
		case line == "-N "+Chain:
			s.chain = true
		case strings.HasPrefix(line, "-A "+Chain+" "):
			s.rules = append(s.rules, line)
		case strings.HasPrefix(line, "-A PREROUTING "):
			pos++
			if line == "-A PREROUTING -j "+Chain {
				s.jumps = append(s.jumps, pos)
			}
		}
	}
	return s
}

// inPlace says whether the table holds exactly the rules wanted, jumped to
// once, first.
func (s mangleState) inPlace(rules []string) bool {
	return s.chain && slices.Equal(s.jumps, []int{1}) && slices.Equal(s.rules, rules)
}

// syncScript is the iptables-restore --noflush input that makes the
// table hold rules, in one commit: the chain declared (which flushes it
// if it exists) and filled, and the jump moved first if it is not.
func syncScript(s mangleState, rules []string) string {
	var b strings.Builder
	b.WriteString("*mangle\n:" + Chain + " - [0:0]\n")
	for _, r := range rules {
		b.WriteString(r + "\n")
	}
	if !slices.Equal(s.jumps, []int{1}) {
		for range s.jumps {
			b.WriteString("-D PREROUTING -j " + Chain + "\n")
		}
		b.WriteString("-I PREROUTING 1 -j " + Chain + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// removeScript is the iptables-restore --noflush input that removes the
// jumps and the chain, in one commit; "" when there is nothing to remove.
func removeScript(s mangleState) string {
	if !s.chain && len(s.jumps) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("*mangle\n")
	for range s.jumps {
		b.WriteString("-D PREROUTING -j " + Chain + "\n")
	}
	if s.chain {
		b.WriteString("-F " + Chain + "\n-X " + Chain + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}
