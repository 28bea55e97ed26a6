package policymap

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/bpf"
)

// listIPMasq prints the kernel's ipmasq maps, one "map prefix" per line.
func listIPMasq(masq *mapOps[*MasqEntry]) (string, error) {
	var out strings.Builder
	for _, m := range []struct {
		name string
		fam  bpf.Family
	}{{bpf.IPMasqV4MapName, bpf.IPv4}, {bpf.IPMasqV6MapName, bpf.IPv6}} {
		mp := masq.openMaps()[m.name]
		if mp == nil {
			continue
		}
		prefixes, err := ListPrefixes(mp, m.fam)
		if err != nil {
			return "", fmt.Errorf("%s: %w", m.name, err)
		}
		for _, p := range prefixes {
			fmt.Fprintf(&out, "%s %s\n", m.name, p)
		}
	}
	return out.String(), nil
}

// waitKernelMatches reads the kernel with list every 10 ms until it prints
// what the script file says or the timeout passes. BPF maps have no change
// notification to wait on.
func waitKernelMatches(s *script.State, file string, timeout time.Duration, what string, list func() (string, error)) error {
	want, err := os.ReadFile(s.Path(file))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		got, err := list()
		if err != nil {
			return err
		}
		if got == string(want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s do not match %s:\n%s", what, file, got)
		}
		select {
		case <-s.Context().Done():
			return s.Context().Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// scriptCommands are the cell's shell and script-test commands: they show
// the kernel maps (not the tables) and inject faults.
func scriptCommands(masq *mapOps[*MasqEntry]) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"policymap/ipmasq-list": script.Command(
			script.CmdUsage{Summary: "List the prefixes in cilium_ipmasq_v4 and cilium_ipmasq_v6, read from the kernel"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				return func(*script.State) (string, string, error) {
					out, err := listIPMasq(masq)
					return out, "", err
				}, nil
			}),
		"policymap/ipmasq-cmp": script.Command(
			script.CmdUsage{
				Summary: "Wait until the kernel's ipmasq maps list exactly as the file says",
				Args:    "file",
				Flags: func(fs *pflag.FlagSet) {
					fs.Duration("timeout", 5*time.Second, "How long to wait for the maps to match")
				},
				Detail: []string{
					"BPF maps have no change notification: the maps are read",
					"every 10ms until they match the file (the format of",
					"policymap/ipmasq-list) or the timeout passes.",
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				timeout, err := s.Flags.GetDuration("timeout")
				if err != nil {
					return nil, err
				}
				return nil, waitKernelMatches(s, args[0], timeout, "ipmasq maps", func() (string, error) { return listIPMasq(masq) })
			}),
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
				open := masq.openMaps()
				prog, err := bpf.LoadMasqDecision(open[bpf.IPMasqV4MapName], open[bpf.IPMasqV6MapName])
				if err != nil {
					return nil, err
				}
				defer prog.Close()
				var out strings.Builder
				for _, a := range args {
					addr, err := netip.ParseAddr(a)
					if err != nil {
						return nil, err
					}
					verdict, err := prog.DecideAddr(addr)
					if err != nil {
						return nil, err
					}
					fmt.Fprintf(&out, "%s %s\n", addr, map[uint32]string{bpf.MasqNoSNAT: "NO_SNAT", bpf.MasqSNAT: "SNAT"}[verdict])
				}
				return func(*script.State) (string, string, error) { return out.String(), "", nil }, nil
			}),
		"policymap/fault-probability": script.Command(
			script.CmdUsage{Summary: "Make this fraction of ipmasq map operations fail", Args: "probability"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				p, err := strconv.ParseFloat(args[0], 64)
				if err != nil {
					return nil, err
				}
				masq.faults.SetProbability(p)
				return nil, nil
			}),
		"policymap/fail-prefix": script.Command(
			script.CmdUsage{Summary: "Make operations on these prefixes fail (none: stop)", Args: "[prefix...]"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				failing := map[string]bool{}
				for _, a := range args {
					p, err := netip.ParsePrefix(a)
					if err != nil {
						return nil, err
					}
					key, err := bpf.EncodePrefix(p)
					if err != nil {
						return nil, err
					}
					failing[string(key)] = true
				}
				if len(failing) == 0 {
					masq.faults.SetFaultFunc(nil)
					return nil, nil
				}
				masq.faults.SetFaultFunc(func(_ string, key []byte) error {
					if failing[string(key)] {
						return fmt.Errorf("injected: key refused")
					}
					return nil
				})
				return nil, nil
			}),
	})
}
