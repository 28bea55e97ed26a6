package dnsproxy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestChainRules(t *testing.T) {
	fs := families()
	got := chainRules(fs[0], []netip.Addr{netip.MustParseAddr("10.0.0.2")}, 40000, 0x200)
	want := []string{
		"-A ENIMASQ-DNS -s 10.0.0.2/32 -p udp -m udp --dport 53 -j TPROXY --on-port 40000 --on-ip 127.0.0.1 --tproxy-mark 0x200/0x200",
		"-A ENIMASQ-DNS -s 10.0.0.2/32 -p tcp -m tcp --dport 53 -j TPROXY --on-port 40000 --on-ip 127.0.0.1 --tproxy-mark 0x200/0x200",
	}
	if !slices.Equal(got, want) {
		t.Errorf("IPv4 rules:\n%s", strings.Join(got, "\n"))
	}
	got = chainRules(fs[1], []netip.Addr{netip.MustParseAddr("fd00::2")}, 40000, 0x200)
	if !strings.Contains(got[0], "-s fd00::2/128 -p udp") || !strings.Contains(got[0], "--on-ip ::1 ") {
		t.Errorf("IPv6 rule: %s", got[0])
	}
}

// listing is what `iptables -t mangle -S` printed here, with a foreign rule
// before the jump.
const listing = `-P PREROUTING ACCEPT
-P INPUT ACCEPT
-N ENIMASQ-DNS
-N OTHER
-A PREROUTING -j OTHER
-A PREROUTING -j ENIMASQ-DNS
-A ENIMASQ-DNS -s 10.0.0.2/32 -p udp -m udp --dport 53 -j TPROXY --on-port 40000 --on-ip 127.0.0.1 --tproxy-mark 0x200/0x200
-A OTHER -j ACCEPT
`

func TestParseMangle(t *testing.T) {
	s := parseMangle(listing)
	if !s.chain || !slices.Equal(s.jumps, []int{2}) || len(s.rules) != 1 {
		t.Fatalf("parsed %+v", s)
	}
	rules := chainRules(families()[0], []netip.Addr{netip.MustParseAddr("10.0.0.2")}, 40000, 0x200)
	if s.inPlace(rules[:1]) {
		t.Error("in place with the jump second")
	}
	script := syncScript(s, rules)
	for _, line := range []string{":ENIMASQ-DNS - [0:0]", rules[0], rules[1], "-D PREROUTING -j ENIMASQ-DNS", "-I PREROUTING 1 -j ENIMASQ-DNS", "COMMIT"} {
		if !strings.Contains(script, line+"\n") {
			t.Errorf("sync script lacks %q:\n%s", line, script)
		}
	}
	if strings.Contains(script, "OTHER") {
		t.Errorf("sync script touches a foreign chain:\n%s", script)
	}

	first := parseMangle(strings.Replace(listing, "-A PREROUTING -j OTHER\n", "", 1))
	if !first.inPlace(rules[:1]) {
		t.Errorf("not in place: %+v", first)
	}
	if script := syncScript(first, rules); strings.Contains(script, "PREROUTING") {
		t.Errorf("jump first already, moved again:\n%s", script)
	}

	rm := removeScript(s)
	for _, line := range []string{"-D PREROUTING -j ENIMASQ-DNS", "-F ENIMASQ-DNS", "-X ENIMASQ-DNS"} {
		if !strings.Contains(rm, line+"\n") {
			t.Errorf("remove script lacks %q:\n%s", line, rm)
		}
	}
	if removeScript(parseMangle("-P PREROUTING ACCEPT\n")) != "" {
		t.Error("remove script with nothing to remove")
	}
}
