package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The pod's gateway is a link-local address answered by a static neighbor
// entry for the host side of the veth: the pod needs no address of the node.
var (
	podGatewayV4 = netip.MustParseAddr("169.254.1.1")
	podGatewayV6 = netip.MustParseAddr("fe80::1")
)

// hostVethName is "lxc" and a short hash of the attachment's container ID
// and interface name (at most 15 characters, the kernel's limit): two
// interfaces of one container are two veths. The network is not in it: an
// interface name is the container's own, whatever network it is in.
func hostVethName(att ipamapi.Attachment) string {
	sum := sha256.Sum256([]byte(att.ContainerID + "\x00" + att.IfName))
	return "lxc" + hex.EncodeToString(sum[:])[:11]
}

// legacyHostVethName is the host veth's name for an attachment recorded
// without a network (checkpoint version 2), made when it was named after
// the container ID alone.
func legacyHostVethName(containerID string) string {
	sum := sha256.Sum256([]byte(containerID))
	return "lxc" + hex.EncodeToString(sum[:])[:11]
}

func gatewayFor(addr netip.Addr) netip.Addr {
	if addr.Is4() {
		return podGatewayV4
	}
	return podGatewayV6
}

func hostPrefix(addr netip.Addr) *net.IPNet {
	return &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(addr.BitLen(), addr.BitLen())}
}

// netConf is the prologue of every command: the network configuration.
func netConf(args *skel.CmdArgs) (*NetConf, error) {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "enimasq-cni: bad network configuration", err.Error())
	}
	return conf, nil
}

// setup is the prologue of the commands on an attachment (ADD, DEL,
// CHECK): the network configuration, the attachment and its pod.
func setup(args *skel.CmdArgs) (*NetConf, ipamapi.Attachment, pod, error) {
	conf, err := netConf(args)
	if err != nil {
		return nil, ipamapi.Attachment{}, pod{}, err
	}
	p, err := podOf(args)
	if err != nil {
		return nil, ipamapi.Attachment{}, pod{}, types.NewError(types.ErrInvalidEnvironmentVariables, "enimasq-cni: cannot name the pod", err.Error())
	}
	return conf, ipamapi.Attachment{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName}, p, nil
}

// agentError is a failed call to the agent as a CNI error: "try again
// later" (11) when the agent is not running, or not ready (restoring its
// checkpoint, reading its CiliumNode).
func agentError(msg string, err error) error {
	if errors.As(err, new(errAgentDown)) {
		return types.NewError(types.ErrTryAgainLater, "enimasq-cni: "+err.Error(), msg)
	}
	if e := (*apiError)(nil); errors.As(err, &e) && e.Body.Reason == "not-ready" {
		return types.NewError(types.ErrTryAgainLater, "enimasq-cni: "+msg, err.Error())
	}
	return types.NewError(types.ErrInternal, "enimasq-cni: "+msg, err.Error())
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, att, p, err := setup(args)
	if err != nil {
		return err
	}
	agent := newAgentClient(conf.AgentSocket, time.Duration(conf.WaitSeconds+5)*time.Second)
	alloc, created, err := agent.allocate(ipamapi.Request{
		Owner: p.Owner, PodUID: p.UID, Network: att.Network, ContainerID: att.ContainerID, IfName: att.IfName, Family: conf.Family,
	}, conf.WaitSeconds)
	if err != nil {
		return agentError("allocation for "+p.Owner+" failed", err)
	}

	// From here on, a failure undoes what this call made, and only that: a
	// retried ADD of a working pod must not tear it down.
	hostName := hostVethName(att)
	done, vethMade := false, false
	defer func() {
		if done {
			return
		}
		if vethMade {
			ip.DelLinkByName(hostName)
		}
		if created {
			agent.release(alloc.IP)
		}
	}()

	result, err := wirePod(args, conf, alloc, hostName, &vethMade)
	if err != nil {
		return types.NewError(types.ErrInternal, "enimasq-cni: wiring pod "+p.Owner, err.Error())
	}
	done = true
	return types.PrintResult(result, conf.CNIVersion)
}

// wirePod creates the veth pair, addresses and routes for an allocation.
func wirePod(args *skel.CmdArgs, conf *NetConf, alloc *ipamapi.AllocationResult, hostName string, vethMade *bool) (*current.Result, error) {
	podIP, err := netip.ParseAddr(alloc.IP)
	if err != nil {
		return nil, fmt.Errorf("agent returned IP %q: %w", alloc.IP, err)
	}
	gw := gatewayFor(podIP)
	mtu := conf.MTU
	if mtu == 0 {
		if mtu, err = eniMTU(alloc.MasterMAC); err != nil {
			return nil, err
		}
	}
	if podIP.Is4() {
		err = ip.EnableIP4Forward()
	} else {
		err = ip.EnableIP6Forward()
	}
	if err != nil {
		return nil, fmt.Errorf("enable forwarding: %w", err)
	}

	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return nil, fmt.Errorf("pod netns %s: %w", args.Netns, err)
	}
	defer podNS.Close()

	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		return nil, err
	}
	defer hostNS.Close()

	var hostIf, podIf net.Interface
	err = podNS.Do(func(ns.NetNS) error {
		var err error
		hostIf, podIf, err = ip.SetupVethWithName(args.IfName, hostName, mtu, "", hostNS)
		if err != nil {
			return fmt.Errorf("veth %s/%s: %w", hostName, args.IfName, err)
		}
		*vethMade = true
		return configurePodSide(args.IfName, podIP, gw, hostIf.HardwareAddr)
	})
	if err != nil {
		return nil, err
	}

	host, err := netlink.LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("host veth %s: %w", hostName, err)
	}
	if err := netlink.RouteReplace(&netlink.Route{
		LinkIndex: host.Attrs().Index,
		Dst:       hostPrefix(podIP),
		Scope:     netlink.SCOPE_LINK,
	}); err != nil {
		return nil, fmt.Errorf("route to pod %s via %s: %w", podIP, hostName, err)
	}

	defaultDst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
	if podIP.Is6() {
		defaultDst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	return &current.Result{
		CNIVersion: conf.CNIVersion,
		Interfaces: []*current.Interface{
			{Name: hostIf.Name, Mac: hostIf.HardwareAddr.String()},
			{Name: podIf.Name, Mac: podIf.HardwareAddr.String(), Sandbox: args.Netns, Mtu: mtu},
		},
		IPs: []*current.IPConfig{{
			Address:   *hostPrefix(podIP),
			Gateway:   gw.AsSlice(),
			Interface: current.Int(1),
		}},
		Routes: []*types.Route{{Dst: *defaultDst, GW: gw.AsSlice()}},
	}, nil
}

// secondaryRouteMetric is the metric base of the routes of a pod's second
// and further interfaces (plus the interface's index).
const secondaryRouteMetric = 100

// configurePodSide runs in the pod's netns: address, a route to the gateway,
// the default route, and a permanent neighbor entry for the gateway.
func configurePodSide(ifName string, podIP, gw netip.Addr, hostMAC net.HardwareAddr) error {
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", ifName, err)
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: hostPrefix(podIP)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", podIP, ifName, err)
	}
	// Another interface of the pod (its first) may hold the routes to the
	// gateway and the default route: this interface's come after them, at
	// a metric of their own, so both interfaces work and the first stays
	// the pod's way out.
	addRoute := func(r *netlink.Route) error {
		err := netlink.RouteAdd(r)
		if errors.Is(err, unix.EEXIST) {
			r.Priority = secondaryRouteMetric + link.Attrs().Index
			err = netlink.RouteAdd(r)
		}
		return err
	}
	if err := addRoute(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: hostPrefix(gw), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("route to gateway %s: %w", gw, err)
	}
	if err := addRoute(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("default route via %s: %w", gw, err)
	}
	family := netlink.FAMILY_V4
	if gw.Is6() {
		family = netlink.FAMILY_V6
	}
	if err := netlink.NeighSet(&netlink.Neigh{
		LinkIndex:    link.Attrs().Index,
		Family:       family,
		State:        netlink.NUD_PERMANENT,
		IP:           gw.AsSlice(),
		HardwareAddr: hostMAC,
	}); err != nil {
		return fmt.Errorf("neighbor %s: %w", gw, err)
	}
	return nil
}

// eniMTU is the MTU of the node's ENI link with this MAC. (netlinksafe
// retries dumps that concurrent link changes interrupt, as happens when many
// pods are set up at once.)
func eniMTU(mac string) (int, error) {
	want, err := net.ParseMAC(mac)
	if err != nil {
		return 0, fmt.Errorf("agent returned master-mac %q: %w", mac, err)
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return 0, err
	}
	for _, l := range links {
		if l.Attrs().HardwareAddr.String() == want.String() {
			return l.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("no ENI link with MAC %s on the node (set \"mtu\" in the network configuration to skip this)", want)
}

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
		if held, err = agent.legacyAllocations(append([]string{p.Owner}, p.LegacyOwners...), familyOf(podIP)); err != nil {
			return err
		}
	}
	if !slices.ContainsFunc(held, func(a ipamapi.AllocationInfo) bool { return a.IP == podIP.String() }) {
		return fmt.Errorf("the agent has no allocation of %s for attachment %s (pod %s)", podIP, att, p.Owner)
	}
	hostName := hostVethName(att)
	host, err := netlink.LinkByName(hostName)
	if err != nil && slices.ContainsFunc(held, func(a ipamapi.AllocationInfo) bool { return a.Network == "" }) {
		hostName = legacyHostVethName(att.ContainerID)
		host, err = netlink.LinkByName(hostName)
	}
	if err != nil {
		return fmt.Errorf("host veth %s: %w", hostName, err)
	}
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Dst: hostPrefix(podIP)}, netlink.RT_FILTER_DST)
	if err != nil || !containsRouteVia(routes, host.Attrs().Index) {
		return fmt.Errorf("no route to %s via %s", podIP, hostName)
	}
	family := unix.AF_INET
	if podIP.Is6() {
		family = unix.AF_INET6
	}
	rules, err := netlinksafe.RuleList(family)
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
		link, err := netlink.LinkByName(args.IfName)
		if err != nil {
			return fmt.Errorf("pod interface %s: %w", args.IfName, err)
		}
		addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
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

func familyOf(addr netip.Addr) string {
	if addr.Is4() {
		return "ipv4"
	}
	return "ipv6"
}

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

// The CNI 1.1 STATUS error codes, which containernetworking/cni v1.3.0 (the
// version Cilium v1.20.2 pins) does not name yet: 50 "the plugin is not
// available" (cannot service ADD requests), 51 "the plugin is not able to
// allocate new IP addresses".
const (
	errPluginNotAvailable uint = 50
	errNoIPsAvailable     uint = 51
)

// cmdStatus answers whether an ADD would work now, as the agent's state
// says: the agent running and ready to allocate (its checkpoint, CiliumNode
// and ip-masq-agent CIDRs loaded) with a free IP of the family. A module
// that is Degraded while the last good state is in force (an invalid
// ip-masq-agent file) does not stop ADDs and does not fail STATUS.
func cmdStatus(args *skel.CmdArgs) error {
	conf, err := netConf(args)
	if err != nil {
		return err
	}
	err = newAgentClient(conf.AgentSocket, 5*time.Second).canAllocate(conf.Family)
	var e *apiError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &e) && e.Body.Reason == "pool-exhausted":
		return types.NewError(errNoIPsAvailable, "enimasq-cni: "+e.Body.Message, "")
	}
	return types.NewError(errPluginNotAvailable, "enimasq-cni: "+err.Error(), "")
}
