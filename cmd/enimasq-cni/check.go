package main

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/enimasq/enimasq/cells/nldump"
	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func cmdCheck(args *skel.CmdArgs) error {
	conf, att, p, err := setup(args)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "enimasq-cni: CHECK needs prevResult", "")
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil || len(prev.IPs) == 0 {
		return types.NewError(types.ErrDecodingFailure, "enimasq-cni: prevResult has no IP", fmt.Sprint(err))
	}
	podIP, _ := netip.AddrFromSlice(prev.IPs[0].Address.IP)
	podIP = podIP.Unmap()
	if err := checkPod(args, conf, att, p, podIP); err != nil {
		return agentError("CHECK failed", err)
	}
	return nil
}

// checkPod verifies what ADD made and what the agent keeps: the
// attachment's allocation of the IP, the veth, the pod address, the host
// route and the pod's ip rules. An IP of a version-1 checkpoint (no
// attachment) counts when the pod's owner holds it.
func checkPod(args *skel.CmdArgs, conf *NetConf, att ipamapi.Attachment, p pod, podIP netip.Addr) error {
	agent := newAgentClient(conf.AgentSocket, 10*time.Second)
	held, err := agent.attachmentAllocations(att)
	if err != nil {
		return err
	}
	if len(held) == 0 {
		if held, err = agent.legacyAllocations(append([]string{p.Owner}, p.LegacyOwners...), ipamapi.FamilyOf(podIP)); err != nil {
			return err
		}
	}
	if !slices.ContainsFunc(held, func(a ipamapi.AllocationInfo) bool { return a.IP == podIP.String() }) {
		return fmt.Errorf("the agent has no allocation of %s for attachment %s (pod %s)", podIP, att, p.Owner)
	}
	hostName := hostVethName(att)
	host, err := nldump.LinkByName(hostName)
	if err != nil && slices.ContainsFunc(held, func(a ipamapi.AllocationInfo) bool { return a.Network == "" }) {
		hostName = legacyHostVethName(att.ContainerID)
		host, err = nldump.LinkByName(hostName)
	}
	if err != nil {
		return fmt.Errorf("host veth %s: %w", hostName, err)
	}
	routes, err := nldump.RoutesFiltered(netlink.FAMILY_ALL, &netlink.Route{Dst: hostPrefix(podIP)}, netlink.RT_FILTER_DST)
	if err != nil || !containsRouteVia(routes, host.Attrs().Index) {
		return fmt.Errorf("no route to %s via %s", podIP, hostName)
	}
	family := unix.AF_INET
	if podIP.Is6() {
		family = unix.AF_INET6
	}
	rules, err := nldump.Rules(family)
	if err != nil {
		return err
	}
	var from, to int
	for _, r := range rules {
		if r.Src != nil && r.Src.String() == hostPrefix(podIP).String() {
			from++
		}
		if r.Dst != nil && r.Dst.String() == hostPrefix(podIP).String() {
			to++
		}
	}
	if from == 0 {
		return fmt.Errorf("no egress ip rule from %s", podIP)
	}
	if to == 0 {
		return fmt.Errorf("no ingress ip rule to %s", podIP)
	}
	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return fmt.Errorf("pod netns %s: %w", args.Netns, err)
	}
	defer podNS.Close()
	return podNS.Do(func(ns.NetNS) error {
		link, err := nldump.LinkByName(args.IfName)
		if err != nil {
			return fmt.Errorf("pod interface %s: %w", args.IfName, err)
		}
		addrs, err := nldump.Addrs(link, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IPNet.String() == hostPrefix(podIP).String() {
				return nil
			}
		}
		return fmt.Errorf("%s has no address %s", args.IfName, podIP)
	})
}
