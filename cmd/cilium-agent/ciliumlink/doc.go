// Package ciliumlink links enimasq's feature cells into Cilium v1.20.2's
// agent, the way a downstream build of Cilium adds cells to
// hive.New(cmd.Agent, ...).
//
// It is the glue and nothing else: the settings Cilium owns (IP families,
// bpf root, masquerading, the ip-masq-agent switch and path, the IPAM mode,
// the native-routing CIDR) become enimasq's nodeconfig.Config from Cilium's
// own *option.DaemonConfig, so Cilium's flags toggle enimasq; the API sources
// list and watch through Cilium's clientset; and each kernel object gets one
// owner:
//
//   - cilium_ipmasq_v4/v6: enimasq only. Cilium's ip-masq-agent writer is
//     turned off (its cell config is decorated to disabled), while
//     option.Config.EnableIPMasqAgent stays true, so Cilium still creates the
//     maps and its datapath still reads them (ENABLE_IP_MASQ_AGENT_IPV4/6).
//     Cilium's ENI IPAM still asks an *ipmasq.IPMasqAgent for the CIDRs of a
//     new pod: it gets one that reads the same file and writes no map.
//   - ENI pod rules: Cilium's IPAM allocates and cilium-cni writes a pod's
//     rules at ADD; enimasq keeps their egress rules (priority 111, table
//     10+ENI number, proto kernel: what RoutingInfo.Configure writes in ENI
//     mode) in step with the ip-masq-agent-cidrs table, for the IPs Cilium
//     configured rules for: its endpoints (pods and the health endpoint, as
//     they are created, restored and deleted) and its router IP, each on the
//     ENI whose addresses hold it (podset.go, through ipam's
//     podset.Writer). Routes and ingress rules stay Cilium's
//     alone; nothing of enimasq writes the CiliumNode.
//   - PolicyEndpoint maps: enimasq's own maps, sources on Cilium's clientset.
//
// The kernel's state: enimasq's kernel cell (cells/kernel: kernel-links,
// kernel-addrs, kernel-routes, kernel-rules) runs in this build too, with
// its one netlink subscription beside those of Cilium's devices controller
// (pkg/datapath/linux/devices_controller.go: addresses, routes, links and
// neighbours, a socket each). Cilium v1.20.2's tables (pkg/datapath/tables)
// cannot stand in for it:
//
//   - rules: Cilium keeps no table of ip rules, and the repair of the pods'
//     egress rules, on in this build, follows kernel-rules: a subscription
//     to the rule groups is needed whatever else is taken from Cilium;
//   - routes: Cilium's tables.Route has no protocol and no TOS (keyed by
//     table, link and destination); the repair of ENI routes needs the
//     protocol (and is off in this build: the routes are Cilium's);
//   - addresses: Cilium's devices table leaves out tentative and DAD-failed
//     addresses, which node-ips holds: its rows would change;
//   - links: enforcement, their reader, is off in this build (Cilium's own
//     policy owns the pods' devices).
//
// Since the rule groups need a socket anyway, and one socket takes every
// group at the same cost, taking links, addresses or routes from Cilium would
// save listings, not a subscription. Before the kernel cell, enimasq held
// two subscriptions in this build (node-ips, the rule repair); now one.
package ciliumlink
