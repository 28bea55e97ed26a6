package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	netpolicy "github.com/enimasq/enimasq/policymap/netpolicy/inspect"
)

const defaultBPFRoot = "/sys/fs/bpf"

// policyCommands are the network-policy commands for the root command:
//
//	enimasq-dbg policy verdict --pod IP --peer IP --direction egress|ingress --proto tcp|udp|sctp --port N
//
// The map listings, `enimasq-dbg bpf policy list [--pod IP]` and `bpf
// policy pods`, belong under the bpf command: see bpfPolicyCommand. They
// read the pinned maps directly (root needed), not the agent.
func policyCommands(o *options) []*cobra.Command {
	return []*cobra.Command{policyCommand(o)}
}

// policyEntryJSON is a policy map entry as -o json|yaml prints it.
type policyEntryJSON struct {
	Map   string       `json:"map"`
	Pod   netip.Addr   `json:"pod"`
	Peer  netip.Prefix `json:"peer"`
	Ports string       `json:"ports"`
}

func entryJSON(e netpolicy.KernelPolicyEntry) policyEntryJSON {
	return policyEntryJSON{Map: e.Map, Pod: e.Pod, Peer: e.Peer, Ports: e.Ports()}
}

// bpfPolicyCommand is `bpf policy`: `bpf policy list [--pod IP]` and `bpf
// policy pods`. It takes --bpf-root from the bpf command.
func bpfPolicyCommand(o *options) *cobra.Command {
	policy := &cobra.Command{Use: "policy", Short: "The network-policy maps (enimasq_egress_v4/_v6, enimasq_ingress_v4/_v6, enimasq_cluster_*, enimasq_policy_pods)"}
	var pod, format string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the policy map entries, decoded: map, pod, peer prefix, allowed ports",
		Long: "Lists every entry of the pinned policy and cluster maps as \"map pod peer ports\", where\n" +
			"ports is \"deny\", \"any\", \"not isolated\" or a list like \"tcp/80,tcp/8000-8080,udp/*\"\n" +
			"(a value's intervals, read whole from its chunks).",
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
			entries := []policyEntryJSON{}
			var lines []string
			for _, name := range slices.Concat(policybpf.PolicyMapNames, policybpf.ClusterMapNames) {
				m, ok := maps[name]
				if !ok {
					continue
				}
				var chunks bpf.LookupMap
				if c, ok := maps[netpolicy.ChunksOf(name)]; ok {
					chunks = c
				}
				var versions bpf.LookupMap
				if v, ok := maps[policybpf.PolicyVersionsMapName]; ok {
					versions = v
				}
				es, err := netpolicy.ListPolicyMap(name, m, chunks, versions, podIP)
				if err != nil {
					return err
				}
				for _, e := range es {
					entries = append(entries, entryJSON(e))
					lines = append(lines, e.String())
				}
			}
			w := cmd.OutOrStdout()
			if format != "" {
				return printAs(w, format, entries)
			}
			// One space between the columns, as the shell's
			// policymap/list prints the entries.
			fmt.Fprintln(w, "MAP POD PEER PORTS")
			for _, l := range lines {
				fmt.Fprintln(w, l)
			}
			return nil
		},
	}
	list.Flags().StringVar(&pod, "pod", "", "Only the entries of this pod IP")
	outputFlag(list, &format)
	policy.AddCommand(list, bpfPolicyPodsCommand(o))
	return policy
}

// policyPod is an entry of enimasq_policy_pods.
type policyPod struct {
	Pod     netip.Addr `json:"pod"`
	Ifindex uint32     `json:"ifindex"`
	Device  string     `json:"device,omitempty"`
}

// bpfPolicyPodsCommand is `bpf policy pods`: the pinned enimasq_policy_pods,
// the pod addresses and the devices they are bound to (the anti-spoofing
// check of the programs).
func bpfPolicyPodsCommand(o *options) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List the pod addresses bound to their devices (enimasq_policy_pods): pod, ifindex, device",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := openPinned(bpfRootOf(o), policybpf.PolicyPodsMapName)
			if err != nil {
				return err
			}
			defer m.Close()
			keys, err := bpf.Keys(m)
			if err != nil {
				return fmt.Errorf("%s: %w", policybpf.PolicyPodsMapName, err)
			}
			names := deviceNames(o)
			pods := []policyPod{}
			for _, k := range keys {
				addr, ok := policybpf.PolicyPodOfKey(k)
				if !ok {
					return fmt.Errorf("%s: a key of %d bytes that is no pod address: the layout changed?", policybpf.PolicyPodsMapName, len(k))
				}
				var ifindex uint32
				if err := m.Lookup(k, &ifindex); errors.Is(err, ebpf.ErrKeyNotExist) {
					continue
				} else if err != nil {
					return fmt.Errorf("%s %s: %w", policybpf.PolicyPodsMapName, addr, err)
				}
				pods = append(pods, policyPod{Pod: addr, Ifindex: ifindex, Device: names(ifindex)})
			}
			slices.SortFunc(pods, func(a, b policyPod) int { return a.Pod.Compare(b.Pod) })
			if format != "" {
				return printAs(cmd.OutOrStdout(), format, pods)
			}
			t := newTable(cmd.OutOrStdout(), "POD", "IFINDEX", "DEVICE")
			for _, p := range pods {
				t.row(p.Pod.String(), strconv.Itoa(int(p.Ifindex)), orDash(p.Device))
			}
			return t.flush()
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// deviceNames names the ifindexes of the pods' devices: as the agent's
// policy-bindings and policy-attachments rows say (the agent may run in
// another network namespace), else as this network namespace's links.
func deviceNames(o *options) func(uint32) string {
	known := map[uint32]string{}
	for _, table := range []string{"policy-bindings", "policy-attachments"} {
		code, body, err := apiGet(o, "/statedb/dump/"+table)
		if err != nil || code != http.StatusOK {
			continue
		}
		var dump map[string][]struct {
			Device  string
			Ifindex uint32
		}
		if json.Unmarshal(body, &dump) != nil {
			continue
		}
		for _, row := range dump[table] {
			known[row.Ifindex] = row.Device
		}
	}
	return func(ifindex uint32) string {
		if name, ok := known[ifindex]; ok || len(known) > 0 {
			return name
		}
		if l, err := net.InterfaceByIndex(int(ifindex)); err == nil {
			return l.Name
		}
		return ""
	}
}

const bpfRootUsage = "bpffs mount the agent pins its maps under (default: asked of the agent, else " + defaultBPFRoot + ")"

// agentBPFRoot is the agent's bpffs root (GET /v1/config), "" when the agent
// does not answer.
func agentBPFRoot(o *options) string {
	if code, body, err := apiGet(o, "/v1/config"); err == nil && code == http.StatusOK {
		var paths struct {
			BPFRoot string `json:"bpfRoot"`
		}
		if json.Unmarshal(body, &paths) == nil {
			return paths.BPFRoot
		}
	}
	return ""
}

// bpfRootOf is the bpffs root to read: --bpf-root when given, else the
// agent's own (GET /v1/config), so that every command works against an
// agent started with another --bpf-root; without an agent, /sys/fs/bpf.
func bpfRootOf(o *options) string {
	if o.bpfRoot != "" {
		return o.bpfRoot
	}
	if root := agentBPFRoot(o); root != "" {
		return root
	}
	return defaultBPFRoot
}

// openPinned opens the pinned map name of the globals dir, read-only.
func openPinned(bpfRoot, name string) (*ebpf.Map, error) {
	path := filepath.Join(bpf.GlobalsDir(bpfRoot), name)
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s is not pinned (is the agent running with --enable-network-policy, and is --bpf-root right?)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return m, nil
}

// openPolicyMaps opens the pinned policy maps under bpfRoot, by name; maps
// that are not pinned (a family the node does not run) are left out. It
// fails when none is pinned.
func openPolicyMaps(bpfRoot string, readOnly bool) (map[string]*ebpf.Map, error) {
	dir := bpf.GlobalsDir(bpfRoot)
	maps := map[string]*ebpf.Map{}
	for _, name := range slices.Concat(policybpf.PolicyMapNames, policybpf.ClusterMapNames, []string{policybpf.PolicyChunksMapName, policybpf.ClusterChunksMapName, policybpf.PolicyVersionsMapName}) {
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
