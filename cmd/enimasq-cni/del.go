package main

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// cmdDel removes the veth and releases the attachment's IPs, and only
// those: another sandbox of the same pod keeps its own. An attachment the
// agent does not hold is released already. Allocations migrated from a
// version-1 checkpoint have no attachment: when the attachment holds
// nothing, the pod's allocations of the family without an attachment are
// released (releaseLegacy).
func cmdDel(args *skel.CmdArgs) error {
	conf, att, p, err := setup(args)
	if err != nil {
		return err
	}

	// The veth goes first: it is local, and removing the host side removes
	// the pair and the host route. A veth already gone is fine.
	if err := ip.DelLinkByName(hostVethName(att)); err != nil && !errors.Is(err, ip.ErrLinkNotFound) {
		return types.NewError(types.ErrInternal, "enimasq-cni: remove veth", err.Error())
	}

	// The kubelet retries DEL: what fails here is released when the agent
	// is back.
	agent := newAgentClient(conf.AgentSocket, 10*time.Second)
	released, err := agent.releaseAttachment(att)
	if err != nil {
		return agentError("release of "+p.Owner+" failed", err)
	}
	for _, a := range released {
		if a.Network == "" {
			// Made when the veth was named after the container alone.
			if err := ip.DelLinkByName(legacyHostVethName(a.ContainerID)); err != nil && !errors.Is(err, ip.ErrLinkNotFound) {
				return types.NewError(types.ErrInternal, "enimasq-cni: remove veth", err.Error())
			}
		}
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
// own veth is gone already): it stays.
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
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Dst: hostPrefix(addr)}, netlink.RT_FILTER_DST)
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
