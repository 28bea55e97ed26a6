package main

import (
	"encoding/json"
	"errors"
	"fmt"
	stdmaps "maps"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/policymap/netpolicy"
)

const defaultBPFRoot = "/sys/fs/bpf"

// policyCommands are the network-policy commands for the root command:
//
//	enimasq-dbg policy verdict --pod IP --peer IP --direction egress|ingress --proto tcp|udp|sctp --port N
//
// The map listing, `enimasq-dbg bpf policy list [--pod IP]`, belongs under
// the bpf command: see bpfPolicyCommand. Both read the pinned maps directly
// (root needed), not the agent.
func policyCommands(o *options) []*cobra.Command {
	return []*cobra.Command{policyCommand(o)}
}

// bpfPolicyCommand is `bpf policy`: `bpf policy list [--pod IP]`. It takes
// --bpf-root from the bpf command.
func bpfPolicyCommand(o *options) *cobra.Command {
	policy := &cobra.Command{Use: "policy", Short: "The network-policy maps (enimasq_egress_v4/_v6, enimasq_ingress_v4/_v6)"}
	var pod string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the policy map entries, decoded: map, pod, peer prefix, allowed ports",
		Long: "Lists every entry of the pinned policy maps as \"map pod peer ports\", where ports is\n" +
			"\"deny\", \"any\" or a list like \"tcp/80,tcp/8000-8080,udp/*\".",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var podIP netip.Addr
			if pod != "" {
				var err error
				if podIP, err = netip.ParseAddr(pod); err != nil {
					return fmt.Errorf("--pod: %w", err)
				}
			}
			maps, err := openPolicyMaps(bpfRootOf(o), true)
			if err != nil {
				return err
			}
			defer closeMaps(maps)
			out, err := netpolicy.ListPolicyMaps(maps, podIP)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
	list.Flags().StringVar(&pod, "pod", "", "Only the entries of this pod IP")
	policy.AddCommand(list)
	return policy
}

const bpfRootUsage = "bpffs mount the agent pins its maps under (default: asked of the agent, else " + defaultBPFRoot + ")"

// bpfRootOf is the bpffs root to read: --bpf-root when given, else the
// agent's own (GET /v1/config), so that every command works against an
// agent started with another --bpf-root; without an agent, /sys/fs/bpf.
func bpfRootOf(o *options) string {
	if o.bpfRoot != "" {
		return o.bpfRoot
	}
	if code, body, err := apiGet(o, "/v1/config"); err == nil && code == http.StatusOK {
		var paths struct {
			BPFRoot string `json:"bpfRoot"`
		}
		if json.Unmarshal(body, &paths) == nil && paths.BPFRoot != "" {
			return paths.BPFRoot
		}
	}
	return defaultBPFRoot
}

func policyCommand(o *options) *cobra.Command {
	var pod, peer, direction, proto string
	var port uint16
	cmd := &cobra.Command{Use: "policy", Short: "Network policy on this node (reads the pinned maps; needs root)"}
	cmd.PersistentFlags().StringVar(&o.bpfRoot, "bpf-root", "", bpfRootUsage)
	verdict := &cobra.Command{
		Use:   "verdict",
		Short: "Run the policy verdict program on the pinned maps for a packet: ALLOW or DENY, and the entry that decided",
		Long: "Builds a packet between --pod and --peer (egress: from the pod; ingress: to the pod)\n" +
			"with the protocol and destination port, runs enimasq's tc verdict program on it with\n" +
			"BPF_PROG_TEST_RUN against the pinned maps, and prints ALLOW or DENY with the pod's\n" +
			"longest matching key and the port entry that allowed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			args := []string{direction, pod, peer, proto}
			if cmd.Flags().Changed("port") {
				args = append(args, strconv.Itoa(int(port)))
			}
			q, err := netpolicy.ParseVerdictQuery(args)
			if err != nil {
				return err
			}
			maps, err := openPolicyMaps(bpfRootOf(o), false)
			if err != nil {
				return err
			}
			defer closeMaps(maps)
			// The node's enforcing mode, so that the verdict is the
			// kernel's; the tracked connections are not used: a verdict
			// is the policy's for a new connection.
			withMode := maps
			mode := filepath.Join(bpf.GlobalsDir(bpfRootOf(o)), bpf.PolicyModeMapName)
			if m, err := ebpf.LoadPinnedMap(mode, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
				defer m.Close()
				withMode = stdmaps.Clone(maps)
				withMode[bpf.PolicyModeMapName] = m
			}
			prog, err := bpf.LoadPolicyProgram(withMode)
			if err != nil {
				return err
			}
			defer prog.Close()
			v, err := netpolicy.JudgePacket(prog, maps, q)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), v)
			return err
		},
	}
	verdict.Flags().StringVar(&pod, "pod", "", "The pod's IP (required)")
	verdict.Flags().StringVar(&peer, "peer", "", "The peer's IP, of the pod's family (required)")
	verdict.Flags().StringVar(&direction, "direction", "egress", "egress (the pod sends) or ingress (the pod receives)")
	verdict.Flags().StringVar(&proto, "proto", "tcp", "tcp, udp, sctp, icmp, icmpv6 or a protocol number")
	verdict.Flags().Uint16Var(&port, "port", 0, "Destination port (required for tcp, udp and sctp)")
	verdict.MarkFlagRequired("pod")
	verdict.MarkFlagRequired("peer")
	cmd.AddCommand(verdict)
	return cmd
}

// openPolicyMaps opens the pinned policy maps under bpfRoot, by name; maps
// that are not pinned (a family the node does not run) are left out. It
// fails when none is pinned.
func openPolicyMaps(bpfRoot string, readOnly bool) (map[string]*ebpf.Map, error) {
	dir := bpf.GlobalsDir(bpfRoot)
	maps := map[string]*ebpf.Map{}
	for _, name := range bpf.PolicyMapNames {
		path := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: readOnly})
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			closeMaps(maps)
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		maps[name] = m
	}
	if len(maps) == 0 {
		return nil, fmt.Errorf("no policy map is pinned in %s (is the agent running with --enable-network-policy, and is --bpf-root right?)", dir)
	}
	return maps, nil
}

func closeMaps(maps map[string]*ebpf.Map) {
	for _, m := range maps {
		m.Close()
	}
}
