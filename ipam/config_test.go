package ipam_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipam"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/datapath"
	"github.com/enimasq/enimasq/ipam/ipamtest"
)

// Linked into Cilium, the rules are cilium-cni's: one per CIDR whenever the
// family is masqueraded (BPF or iptables), a CIDR of 0.0.0.0/0 is a rule
// without destination, no ingress rule is enimasq's, and the "all" mode
// that would fight Cilium's restore is refused.
func TestSettingsLinkedIntoCilium(t *testing.T) {
	node := nodeconfig.Config{
		EnableIPv4: true,
		Masquerade: nodeconfig.Masquerade{BPF: false, IPv4: true}, // iptables masquerading: still per CIDR
		IPAM: nodeconfig.IPAM{Mode: ipam.IPAMModeENI, Allocator: nodeconfig.AllocatorCilium,
			PodRules: nodeconfig.PodRules{IngressPriority: 20, EgressPriority: 111, TableOffset: 10, Protocol: 2}},
	}
	s, err := ipam.NewSettings(ipam.DefaultConfig, node)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Datapath.MasqueradeV4 || s.Allocator.Off == "" || s.PodSet.Off != "" {
		t.Errorf("settings %+v: want per-CIDR rules (cilium-cni's masq = --enable-ipv4-masquerade) and Cilium's allocations", s)
	}
	eni := &ciliumnode.ENI{ID: "eni-1", Number: 1}
	rules := datapath.PodRules(netip.MustParseAddr("10.0.1.5"), "a/b", eni, ipamtest.Prefixes(t, "0.0.0.0/0"), s.Datapath)
	if len(rules) != 1 || rules[0].Priority != 111 || rules[0].To.IsValid() || rules[0].Table != 11 {
		t.Errorf("rules %v: want one 111 rule without destination into table 11, no ingress rule", rules)
	}

	cfg := ipam.DefaultConfig
	cfg.ENIEgressRuleMode = datapath.EgressModeAll
	if _, err := ipam.NewSettings(cfg, node); err == nil || !strings.Contains(err.Error(), "--eni-egress-rule-mode") {
		t.Errorf("mode all linked into Cilium: %v", err)
	}
	node.IPAM.Mode = "cluster-pool"
	if s, err := ipam.NewSettings(ipam.DefaultConfig, node); err != nil || s.Off == "" {
		t.Errorf("Cilium with cluster-pool IPAM: settings %+v, %v: want off, no error", s, err)
	}
	node.IPAM.Allocator = nodeconfig.AllocatorEnimasq
	if _, err := ipam.NewSettings(ipam.DefaultConfig, node); err == nil || !strings.Contains(err.Error(), "--ipam") {
		t.Errorf("standalone with cluster-pool IPAM: %v", err)
	}
}
