package ciliumlink

import (
	"log/slog"
	"net/netip"

	"github.com/cilium/hive/cell"

	"github.com/cilium/cilium/pkg/ipmasq"
	ipmasqcell "github.com/cilium/cilium/pkg/ipmasq/cell"
	"github.com/cilium/cilium/pkg/option"
)

// disableCiliumIPMasqWriter turns Cilium's ip-masq-agent off as a writer of
// cilium_ipmasq_v4/v6: its constructor returns no agent, so nothing of
// Cilium's updates, deletes or restores the maps' entries. Only the cell's
// config is changed: option.Config.EnableIPMasqAgent, which the datapath
// defines (ENABLE_IP_MASQ_AGENT_IPV4/6), the maps' creation
// (pkg/maps/ipmasq) and the map sweeper read, stays as the flag set it, so
// Cilium still creates the maps and its datapath still reads what enimasq
// writes.
func disableCiliumIPMasqWriter(c ipmasqcell.Config) ipmasqcell.Config {
	c.EnableIPMasqAgent = false
	return c
}

// readOnlyIPMasqAgent gives Cilium's ENI IPAM, which asks an
// *ipmasq.IPMasqAgent for the non-masquerade CIDRs of every new pod
// (pkg/ipam/eni.go, when option.Config.EnableIPMasqAgent), an agent that
// reads and watches the same ip-masq-agent file and writes to no map. The
// CIDRs cilium-cni writes at ADD are thus right from the start; enimasq's
// rule reconciler keeps them right afterwards.
//
// Cilium's agent fails to start when the config directory is missing
// (cilium#13502): this one then reads the defaults and logs it, and
// enimasq's own watcher picks the file up when it appears.
func readOnlyIPMasqAgent(a *ipmasq.IPMasqAgent, c ipmasqcell.Config, dc *option.DaemonConfig, lc cell.Lifecycle, log *slog.Logger) *ipmasq.IPMasqAgent {
	if a != nil || !dc.EnableIPMasqAgent {
		// Cilium's writer is on (disableCiliumIPMasqWriter was not
		// applied), or there is no ip-masq-agent: Cilium's IPAM does not ask.
		return a
	}
	log = log.With("subsys", "enimasq-ipmasq-reader")
	reader := ipmasq.NewIPMasqAgent(log, c.IPMasqAgentConfigPath, noMap{})
	if err := reader.Update(); err != nil {
		log.Warn("Reading the ip-masq-agent config for Cilium's IPAM", "error", err)
	}
	started := false
	lc.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			if err := reader.Start(); err != nil {
				log.Warn("Not watching the ip-masq-agent config for Cilium's IPAM (new pods get the CIDRs read at start; enimasq corrects their rules)",
					"path", c.IPMasqAgentConfigPath, "error", err)
				return nil
			}
			started = true
			return nil
		},
		OnStop: func(cell.HookContext) error {
			if started {
				reader.Stop()
			}
			return nil
		},
	})
	return reader
}

// noMap is the map of the read-only agent: it keeps nothing.
type noMap struct{}

func (noMap) Update(netip.Prefix) error     { return nil }
func (noMap) Delete(netip.Prefix) error     { return nil }
func (noMap) Dump() ([]netip.Prefix, error) { return nil, nil }
