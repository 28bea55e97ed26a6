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
package ciliumlink
