package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/vishvananda/netlink"
)

// cmdGC (CNI 1.1) releases the IPs of every attachment of the network
// (its name, conf.Name) that is not in cni.dev/valid-attachments, and
// removes their host veths (and so their host routes); the attachments of
// other networks are not looked at. Without the key, as cnitool's gc sends it,
// no attachment is valid. Allocations made through the agent API (no
// attachment) are not the plugin's: they stay.
func cmdGC(args *skel.CmdArgs) error {
	conf, err := netConf(args)
	if err != nil {
		return err
	}
	valid := make([]ipamapi.Attachment, 0, len(conf.ValidAttachments))
	for _, a := range conf.ValidAttachments {
		valid = append(valid, ipamapi.Attachment{Network: conf.Name, ContainerID: a.ContainerID, IfName: a.IfName})
	}
	agent := newAgentClient(conf.AgentSocket, 30*time.Second)
	released, err := agent.gc(conf.Name, valid)
	if err != nil {
		return agentError("GC failed", err)
	}
	// Each released attachment's veth goes: it is its own (named after its
	// container and interface).
	var errs []error
	for _, a := range released {
		if a.ContainerID == "" {
			continue
		}
		if err := ip.DelLinkByName(hostVethName(a.Attachment())); err != nil && !errors.Is(err, ip.ErrLinkNotFound) {
			errs = append(errs, fmt.Errorf("remove veth of %s: %w", a.Attachment(), err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, "enimasq-cni: GC released the IPs but left veths", err.Error())
	}
	return nil
}

func containsRouteVia(routes []netlink.Route, ifindex int) bool {
	for _, r := range routes {
		if r.LinkIndex == ifindex {
			return true
		}
	}
	return false
}
