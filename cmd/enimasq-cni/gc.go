package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
)

// cmdGC (CNI 1.1) releases the IPs of every attachment of the network
// (its name, conf.Name) that is not in cni.dev/valid-attachments, and
// removes the host veths that route those IPs (and so their host routes);
// the attachments of other networks are not looked at, nor their veths.
// Without the key, as cnitool's gc sends it, no attachment is valid. Allocations made through the agent API (no
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
	// The node's routes from before the release: a released IP handed out
	// again at once is routed to its new pod's veth.
	routes, err := nodePodRoutes()
	if err != nil {
		return types.NewError(types.ErrInternal, "enimasq-cni: GC", err.Error())
	}
	agent := newAgentClient(conf.AgentSocket, 30*time.Second)
	released, err := agent.gc(conf.Name, valid)
	if err != nil {
		return agentError("GC failed", err)
	}
	// A released attachment's veth goes when it routes the attachment's IP:
	// another network's attachment of the same container and interface has
	// a veth of the same name, which stays.
	var errs []error
	for _, a := range released {
		if a.ContainerID == "" {
			continue
		}
		veths, err := ownedVeths(a.Attachment(), []string{a.IP}, nil, routes)
		if err == nil {
			err = removeVeths(veths)
		}
		if err != nil {
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
