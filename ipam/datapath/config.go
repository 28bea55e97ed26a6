package datapath

import (
	"net/netip"
	"time"

	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// Egress rule modes (--eni-egress-rule-mode).
const (
	// EgressModeCIDR: one priority-111 rule per pod and CIDR of the
	// allocation result, as Cilium does with masquerading on.
	EgressModeCIDR = "cidr"
	// EgressModeAll: one priority-111 rule per pod for all destinations
	// (upstream's answer to cilium#45137).
	EgressModeAll = "all"
)

// Settings are what the datapath part takes (validated by the ipam cell,
// which owns the flags): the shape of the rules, and which of a pod's
// kernel objects are enimasq's to write.
type Settings struct {
	// Off, when set, says why nothing is derived or reconciled: the tables
	// exist, are initialized and stay empty.
	Off string

	// EgressMode is EgressModeCIDR or EgressModeAll.
	EgressMode string
	// NativeRouting are --ipv4/ipv6-native-routing-cidr (invalid when
	// unset): CIDRs of every allocation result.
	NativeRouting []netip.Prefix
	// MasqueradeV4 and MasqueradeV6: the family is masqueraded
	// (--enable-ipv4/6-masquerade, in BPF or by iptables), as cilium-cni
	// decides. With it off, the egress rule is one rule for all
	// destinations, as in Cilium.
	MasqueradeV4, MasqueradeV6 bool
	// EnableIPv4 and EnableIPv6 are the families the node runs.
	EnableIPv4, EnableIPv6 bool
	// PodRules is the shape (priorities, table offset, protocol) of the
	// pod rules.
	PodRules nodeconfig.PodRules

	// IngressRules: the pod's ingress rule ("to <pod> lookup main") is
	// enimasq's to write. When it is not, the CNI that writes it says with
	// it that the IP is in use: an IP with an ingress rule keeps its egress
	// rules until the rule goes, listed in ipam-allocations or not.
	IngressRules bool
	// Routes: the ENI tables' routes are enimasq's to write (a reconciler
	// of eni-routes runs, and their repair).
	Routes bool
	// SharedProtocol: PodRules.Protocol is shared with other writers (the
	// kernel's own rules carry it): of its rules, only the egress rules in
	// the pod shape are enimasq's to prune. Otherwise every rule of the
	// protocol is.
	SharedProtocol bool

	// RetryMin and RetryMax bound the backoff of a failed rule or route;
	// RefreshPeriod is the full refresh and prune (drift repair).
	RetryMin, RetryMax, RefreshPeriod time.Duration
}

// Masquerade says whether masquerading is on for the family of addr.
func (s Settings) Masquerade(addr netip.Addr) bool {
	if addr.Is4() {
		return s.MasqueradeV4
	}
	return s.MasqueradeV6
}

// FamilyEnabled says whether the node runs the family of addr.
func (s Settings) FamilyEnabled(addr netip.Addr) bool {
	if addr.Is4() {
		return s.EnableIPv4
	}
	return s.EnableIPv6
}
