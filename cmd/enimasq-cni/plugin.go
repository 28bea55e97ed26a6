package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

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

// hostVethName is "lxc" and a short hash of the container ID (at most 15
// characters, the kernel's limit).
func hostVethName(containerID string) string {
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

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "enimasq-cni: bad network configuration", err.Error())
	}
	own, err := owner(args)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "enimasq-cni: cannot name the pod", err.Error())
	}
	agent := newAgentClient(conf.AgentSocket, time.Duration(conf.WaitSeconds+5)*time.Second)
	alloc, created, err := agent.allocate(own, conf.Family, conf.WaitSeconds)
	if err != nil {
		if errors.As(err, new(errAgentDown)) {
			return types.NewError(types.ErrTryAgainLater, "enimasq-cni: "+err.Error(), "")
		}
		return types.NewError(types.ErrInternal, "enimasq-cni: allocation for "+own+" failed", err.Error())
	}

	// From here on, a failure undoes what this call made, and only that: a
	// retried ADD of a working pod must not tear it down.
	hostName := hostVethName(args.ContainerID)
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
		return types.NewError(types.ErrInternal, "enimasq-cni: wiring pod "+own, err.Error())
	}
	done = true
	return types.PrintResult(result, conf.CNIVersion)
}

// wirePod creates the veth pair, addresses and routes for an allocation.
func wirePod(args *skel.CmdArgs, conf *NetConf, alloc *allocation, hostName string, vethMade *bool) (*current.Result, error) {
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
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: hostPrefix(gw), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("route to gateway %s: %w", gw, err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
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

func cmdDel(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "enimasq-cni: bad network configuration", err.Error())
	}
	own, err := owner(args)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "enimasq-cni: cannot name the pod", err.Error())
	}

	// The veth goes first: it is local, and removing the host side removes
	// the pair and the host route. A veth already gone is fine.
	if err := ip.DelLinkByName(hostVethName(args.ContainerID)); err != nil && !errors.Is(err, ip.ErrLinkNotFound) {
		return types.NewError(types.ErrInternal, "enimasq-cni: remove veth", err.Error())
	}

	agent := newAgentClient(conf.AgentSocket, 10*time.Second)
	ips, err := agent.ownedBy(own)
	if err != nil {
		// The kubelet retries DEL: the IP is released when the agent is back.
		return types.NewError(types.ErrTryAgainLater, "enimasq-cni: release of "+own+" failed", err.Error())
	}
	for _, addr := range ips {
		if err := agent.release(addr); err != nil {
			return types.NewError(types.ErrInternal, "enimasq-cni: release "+addr, err.Error())
		}
	}
	return nil
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "enimasq-cni: bad network configuration", err.Error())
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
	if err := checkPod(args, conf, podIP); err != nil {
		return types.NewError(types.ErrInternal, "enimasq-cni: CHECK failed", err.Error())
	}
	return nil
}

// checkPod verifies what ADD made and what the agent keeps: the veth, the
// pod address, the host route, the allocation and the pod's ip rules.
func checkPod(args *skel.CmdArgs, conf *NetConf, podIP netip.Addr) error {
	own, err := owner(args)
	if err != nil {
		return err
	}
	agent := newAgentClient(conf.AgentSocket, 10*time.Second)
	ips, err := agent.ownedBy(own)
	if err != nil {
		return err
	}
	found := false
	for _, a := range ips {
		found = found || a == podIP.String()
	}
	if !found {
		return fmt.Errorf("the agent has no allocation of %s for %s", podIP, own)
	}
	hostName := hostVethName(args.ContainerID)
	host, err := netlink.LinkByName(hostName)
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

func containsRouteVia(routes []netlink.Route, ifindex int) bool {
	for _, r := range routes {
		if r.LinkIndex == ifindex {
			return true
		}
	}
	return false
}

// errPluginNotAvailable is the CNI 1.1 STATUS error code 50 ("the plugin is
// not available"), which containernetworking/cni v1.3.0 (the version Cilium
// v1.20.2 pins) does not name yet.
const errPluginNotAvailable uint = 50

func cmdStatus(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "enimasq-cni: bad network configuration", err.Error())
	}
	if err := newAgentClient(conf.AgentSocket, 5*time.Second).healthy(); err != nil {
		return types.NewError(errPluginNotAvailable, "enimasq-cni: "+err.Error(), "")
	}
	return nil
}
