package masqmap

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// masqFamily is one family's ipmasq map: programmed only when the family runs
// on the node and its masquerading is on.
type masqFamily struct {
	name    string // the map's name
	spec    func() *ebpf.MapSpec
	enabled bool
	skipped string // why the family is not programmed
}

func masqFamilies(node nodeconfig.Config) (v4, v6 masqFamily) {
	cfg := node.Masquerade
	v4 = masqFamily{name: "cilium_ipmasq_v4", spec: bpf.IPMasqV4Spec, enabled: true}
	v6 = masqFamily{name: "cilium_ipmasq_v6", spec: bpf.IPMasqV6Spec, enabled: true}
	switch {
	case !node.EnableIPv4:
		v4.enabled, v4.skipped = false, "IPv4 is disabled on this node (--enable-ipv4=false)"
	case !cfg.IPv4:
		v4.enabled, v4.skipped = false, "IPv4 masquerading is off (--enable-ipv4-masquerade=false)"
	}
	switch {
	case !node.EnableIPv6:
		v6.enabled, v6.skipped = false, "IPv6 is disabled on this node (--enable-ipv6=false)"
	case !cfg.IPv6:
		v6.enabled, v6.skipped = false, "IPv6 masquerading is off (--enable-ipv6-masquerade=false)"
	}
	return v4, v6
}

// masqEntryFor is the desired entry for a non-masquerade CIDR: an entry of
// its family's map, or a skipped entry when the family is not programmed.
// The key is built from the prefix of its own family only.
func masqEntryFor(log *slog.Logger, v4, v6 masqFamily, p netip.Prefix) *Entry {
	fam := v4
	if !p.Addr().Is4() {
		fam = v6
	}
	if !fam.enabled {
		log.Info("Non-masquerade CIDR skipped", "prefix", p, "reason", fam.skipped)
		return &Entry{Prefix: p, Skipped: fam.skipped}
	}
	key, err := bpf.EncodePrefix(p)
	if err != nil {
		// The ipmasq table only holds valid prefixes; say so if not.
		return &Entry{Prefix: p, Skipped: fmt.Sprintf("cannot encode: %s", err)}
	}
	return &Entry{Prefix: p, Map: fam.name, key: key, Status: reconciler.StatusPending()}
}
