package masqmap

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/masqbpf"
	"github.com/enimasq/enimasq/cells/scriptcmd"
	"github.com/enimasq/enimasq/policymap"
)

// listIPMasq prints the kernel's ipmasq maps, one "map prefix" per line.
func listIPMasq(masq *policymap.Maps[*Entry]) (string, error) {
	var out strings.Builder
	for _, m := range []struct {
		name string
		fam  bpf.Family
	}{{bpf.IPMasqV4MapName, bpf.IPv4}, {bpf.IPMasqV6MapName, bpf.IPv6}} {
		mp := masq.Opened()[m.name]
		if mp == nil {
			continue
		}
		prefixes, err := policymap.ListPrefixes(mp, m.fam)
		if err != nil {
			return "", fmt.Errorf("%s: %w", m.name, err)
		}
		for _, p := range prefixes {
			fmt.Fprintf(&out, "%s %s\n", m.name, p)
		}
	}
	return out.String(), nil
}

// scriptCommands are the cell's shell and script-test commands: they show
// the kernel maps (not the tables) and inject faults.
func scriptCommands(masq *policymap.Maps[*Entry]) hive.ScriptCmdsOut {
	cmds := map[string]script.Cmd{
		"policymap/ipmasq-list": scriptcmd.List("List the prefixes in cilium_ipmasq_v4 and cilium_ipmasq_v6, read from the kernel",
			nil, func(*script.State) (string, error) { return listIPMasq(masq) }),
		"policymap/ipmasq-cmp": scriptcmd.Cmp("Wait until the kernel's ipmasq maps list exactly as the file says (policymap/ipmasq-list)",
			"ipmasq maps", nil, func(*script.State) (string, error) { return listIPMasq(masq) }),
		"policymap/masq-decide": script.Command(
			script.CmdUsage{
				Summary: "Run the masquerade decision program on the ipmasq maps for destination addresses",
				Args:    "address...",
				Detail: []string{
					"Prints one line per address: SNAT (masqueraded) or NO_SNAT (a",
					"non-masquerade CIDR), as Cilium's datapath decides with these maps.",
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) == 0 {
					return nil, script.ErrUsage
				}
				open := masq.Opened()
				decide := func(a netip.Addr) (uint32, error) {
					return masqbpf.MasqDecideModel(open[bpf.IPMasqV4MapName], open[bpf.IPMasqV6MapName], a)
				}
				if kernel, ok := bpf.KernelMaps(open); ok {
					prog, err := masqbpf.LoadMasqDecision(kernel[bpf.IPMasqV4MapName], kernel[bpf.IPMasqV6MapName])
					if err != nil {
						return nil, err
					}
					defer prog.Close()
					decide = prog.DecideAddr
				}
				var out strings.Builder
				for _, a := range args {
					addr, err := netip.ParseAddr(a)
					if err != nil {
						return nil, err
					}
					verdict, err := decide(addr)
					if err != nil {
						return nil, err
					}
					fmt.Fprintf(&out, "%s %s\n", addr, map[uint32]string{masqbpf.MasqNoSNAT: "NO_SNAT", masqbpf.MasqSNAT: "SNAT"}[verdict])
				}
				return func(*script.State) (string, string, error) { return out.String(), "", nil }, nil
			}),
	}
	maps.Copy(cmds, policymap.FaultCommands(masq, "ipmasq map", "policymap/fault-probability", "policymap/fail-prefix", policymap.FaultKeys{
		Args:  1,
		Usage: "prefix",
		Encode: func(args []string) ([]byte, error) {
			p, err := netip.ParsePrefix(args[0])
			if err != nil {
				return nil, err
			}
			return bpf.EncodePrefix(p)
		},
	}))
	return hive.NewScriptCmds(cmds)
}
