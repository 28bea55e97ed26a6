package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/masqbpf"
	"github.com/enimasq/enimasq/policymap"
)

// bpfCommand reads the pinned maps directly, like `cilium-dbg bpf ...`: it
// shows what the kernel holds, not what the agent wants.
func bpfCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "bpf", Short: "Read the BPF maps pinned by the agent"}
	cmd.PersistentFlags().StringVar(&o.bpfRoot, "bpf-root", "", bpfRootUsage)

	ipmasq := &cobra.Command{Use: "ipmasq", Short: "The masquerade exemption maps (cilium_ipmasq_v4, cilium_ipmasq_v6)"}
	var format string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the non-masquerade prefixes in the kernel maps",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			maps, err := openIPMasqMaps(bpfRootOf(o))
			if err != nil {
				return err
			}
			defer maps.close()
			type entry struct {
				Map    string       `json:"map"`
				Prefix netip.Prefix `json:"prefix"`
			}
			entries := []entry{}
			for _, m := range maps.list() {
				prefixes, err := policymap.ListPrefixes(m.m, m.fam)
				if err != nil {
					return fmt.Errorf("%s: %w", m.name, err)
				}
				for _, p := range prefixes {
					entries = append(entries, entry{m.name, p})
				}
			}
			if format != "" {
				return printAs(cmd.OutOrStdout(), format, entries)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%-18s %s\n", "MAP", "IP PREFIX/ADDRESS")
			for _, e := range entries {
				fmt.Fprintf(w, "%-18s %s\n", e.Map, e.Prefix)
			}
			return nil
		},
	}
	outputFlag(list, &format)
	ipmasq.AddCommand(
		list,
		&cobra.Command{
			Use:   "decide ADDRESS...",
			Short: "Run the masquerade decision program on the kernel maps: SNAT or NO_SNAT per destination",
			Args:  cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				maps, err := openIPMasqMaps(bpfRootOf(o))
				if err != nil {
					return err
				}
				defer maps.close()
				prog, err := masqbpf.LoadMasqDecision(maps.v4, maps.v6)
				if err != nil {
					return err
				}
				defer prog.Close()
				for _, a := range args {
					addr, err := netip.ParseAddr(a)
					if err != nil {
						return err
					}
					v, err := prog.DecideAddr(addr)
					if err != nil {
						return err
					}
					decision := "SNAT"
					if v == masqbpf.MasqNoSNAT {
						decision = "NO_SNAT"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", addr, decision)
				}
				return nil
			},
		},
	)
	cmd.AddCommand(ipmasq, bpfPolicyCommand(o), bpfCTCommand(o), bpfProgsCommand(o))
	return cmd
}

type ipmasqMaps struct{ v4, v6 *ebpf.Map }

type namedMap struct {
	name string
	fam  bpf.Family
	m    *ebpf.Map
}

// openIPMasqMaps opens the pinned maps read-only; a family without a pinned
// map (disabled on the node) is nil. Neither pinned is an error.
func openIPMasqMaps(bpfRoot string) (*ipmasqMaps, error) {
	dir := bpf.GlobalsDir(bpfRoot)
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return m, err
	}
	v4, err := open(bpf.IPMasqV4MapName)
	if err != nil {
		return nil, err
	}
	v6, err := open(bpf.IPMasqV6MapName)
	if err != nil {
		v4.Close()
		return nil, err
	}
	if v4 == nil && v6 == nil {
		return nil, fmt.Errorf("no ipmasq map pinned under %s (is the agent running with --enable-ip-masq-agent, and --bpf-root right?)", dir)
	}
	return &ipmasqMaps{v4: v4, v6: v6}, nil
}

func (m *ipmasqMaps) list() []namedMap {
	var out []namedMap
	if m.v4 != nil {
		out = append(out, namedMap{bpf.IPMasqV4MapName, bpf.IPv4, m.v4})
	}
	if m.v6 != nil {
		out = append(out, namedMap{bpf.IPMasqV6MapName, bpf.IPv6, m.v6})
	}
	return out
}

func (m *ipmasqMaps) close() {
	for _, nm := range m.list() {
		nm.m.Close()
	}
}
