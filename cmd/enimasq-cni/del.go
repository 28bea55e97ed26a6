package main

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/cells/nldump"
)

// cmdDel removes the attachment's veth and releases its IPs, and only
// those: another sandbox of the same pod keeps its own, and another
// network's attachment of the same container and interface keeps its veth
// (the veth's name has no network in it): the veth goes only when it is
// provably this network's attachment's (ownedVeths). An attachment the
// agent does not hold is released already. Allocations migrated from a
// version-1 checkpoint have no attachment: when the attachment holds
// nothing, the pod's allocations of the family without an attachment are
// released (releaseLegacy).
func cmdDel(args *skel.CmdArgs) error {
	conf, att, p, err := setup(args)
	if err != nil {
		return err
	}

	// The agent says which IPs this network's attachment holds, and the
	// node's routes which veth they go via, before anything is released.
	// With the agent down or not ready, only what the runtime's prevResult
	// proves is this attachment's goes; the kubelet retries DEL.
	agent := newAgentClient(conf.AgentSocket, 10*time.Second)
	held, agentErr := agent.attachmentAllocations(att)
	routes, err := nodePodRoutes()
	if err != nil {
		return types.NewError(types.ErrInternal, "enimasq-cni: find the attachment's veth", err.Error())
	}
	veths, err := ownedVeths(att, ips(held), prevResultOf(conf), routes)
	if err != nil {
		return types.NewError(types.ErrInternal, "enimasq-cni: find the attachment's veth", err.Error())
	}
	// The veth goes before the IPs: removing the host side removes the pair
	// and the host route, so a released IP is never still routed to it.
	if err := removeVeths(veths); err != nil {
		return err
	}
	if agentErr != nil {
		return agentError("release of "+p.Owner+" failed", agentErr)
	}

	released, err := agent.releaseAttachment(att)
	if err != nil {
		return agentError("release of "+p.Owner+" failed", err)
	}
	if len(released) > 0 {
		return nil
	}
	if err := releaseLegacy(agent, conf, p); err != nil {
		return agentError("release of "+p.Owner+" failed", err)
	}
	return nil
}

// releaseLegacy releases the allocations of the pod's owner (and legacy
// owners) without an attachment: those of a version-1 checkpoint, made
// before allocations were held by attachments. An IP that the node still
// routes to a pod's veth belongs to a live sandbox of the pod (this DEL's
// own veth is gone already when its prevResult named it): it stays.
func releaseLegacy(agent *agentClient, conf *NetConf, p pod) error {
	legacy, err := agent.legacyAllocations(append([]string{p.Owner}, p.LegacyOwners...), conf.Family)
	if err != nil {
		return err
	}
	for _, a := range legacy {
		addr, err := netip.ParseAddr(a.IP)
		if err != nil {
			continue
		}
		routed, err := routedToPod(addr)
		if err != nil {
			return fmt.Errorf("is %s a live sandbox's: %w", a.IP, err)
		}
		if routed {
			continue
		}
		if err := agent.release(a.IP); err != nil {
			return fmt.Errorf("release %s: %w", a.IP, err)
		}
	}
	return nil
}

// routedToPod says whether the node has a route to addr/32 (/128) via a
// link, as ADD makes for a pod.
func routedToPod(addr netip.Addr) (bool, error) {
	routes, err := nldump.RoutesFiltered(netlink.FAMILY_ALL, &netlink.Route{Dst: hostPrefix(addr)}, netlink.RT_FILTER_DST)
	if err != nil {
		return false, err
	}
	for _, r := range routes {
		if r.LinkIndex > 0 && r.Dst != nil && r.Dst.String() == hostPrefix(addr).String() {
			return true, nil
		}
	}
	return false, nil
}
