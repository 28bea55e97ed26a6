package netpolicy

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/scriptcmd"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/netpolicy/compile"
	"github.com/enimasq/enimasq/policymap/netpolicy/enforce"
	"github.com/enimasq/enimasq/policymap/netpolicy/inspect"
)

// policyScriptCommands are the shell and script-test commands of the
// network-policy maps: they read the kernel maps (not the tables), run the
// verdict program on them, and inject faults.
func policyScriptCommands(ops *policymap.Maps[*compile.PolicyMapEntry], all compile.KernelMaps, names enforce.ObjectNames,
	db *statedb.DB, versions statedb.Table[*compile.PodVersions]) hive.ScriptCmdsOut {
	podFlag := func(fs *pflag.FlagSet) { fs.String("pod", "", "Only the entries of this pod IP") }
	podOf := func(s *script.State) (netip.Addr, error) {
		v, err := s.Flags.GetString("pod")
		if err != nil || v == "" {
			return netip.Addr{}, err
		}
		return netip.ParseAddr(v)
	}
	listMaps := func(s *script.State) (string, error) {
		pod, err := podOf(s)
		if err != nil {
			return "", err
		}
		return inspect.ListPolicyMaps(all.Opened(), pod)
	}
	judge := func(queries [][]string) (string, error) {
		// The verdicts of the settled state: every pod's newest version
		// in force (a test asks after the tables show its change).
		if err := compile.WaitVersionsSettled(db, versions, 10*time.Second); err != nil {
			return "", err
		}
		var prog *policybpf.PolicyProgram // nil on fake maps: the entries decide
		if kernel, ok := bpf.KernelMaps(all.Opened()); ok {
			p, err := policybpf.LoadPolicyProgram(kernel)
			if err != nil {
				return "", err
			}
			defer p.Close()
			prog = p
		}
		var out strings.Builder
		for _, args := range queries {
			q, err := inspect.ParseVerdictQuery(args)
			if err != nil {
				return "", err
			}
			v, err := inspect.JudgePacket(prog, all.Opened(), q)
			if err != nil {
				return "", err
			}
			v.Object = names(q.Direction, enforce.VerdictQuery{Pod: q.Pod, Peer: q.Peer, Protocol: q.Protocol, Port: q.Port}, v.Result)
			fmt.Fprintln(&out, v)
		}
		return out.String(), nil
	}

	cmds := map[string]script.Cmd{
		"policymap/policy-list": scriptcmd.List("List the network-policy maps, read from the kernel: \"map pod peer ports\" per entry",
			podFlag, listMaps),
		"policymap/policy-cmp": scriptcmd.Cmp("Wait until the kernel's network-policy maps list exactly as the file says (policymap/policy-list)",
			"policy maps", podFlag, listMaps),
		"policymap/policy-verdict": script.Command(
			script.CmdUsage{
				Summary: "Run the policy verdict program on the kernel maps for a packet",
				Args:    "direction pod peer protocol [port]",
				Detail: []string{
					"Prints ALLOW or DENY, the packet, and the entry that decided.",
					"Example: policymap/policy-verdict egress 10.0.0.5 10.1.2.3 udp 53",
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				out, err := judge([][]string{args})
				if err != nil {
					return nil, err
				}
				return func(*script.State) (string, string, error) { return out, "", nil }, nil
			}),
		"policymap/policy-verdicts": script.Command(
			script.CmdUsage{
				Summary: "Run the policy verdict program for each packet of a file, one \"direction pod peer protocol [port]\" per line",
				Args:    "file",
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				data, err := os.ReadFile(s.Path(args[0]))
				if err != nil {
					return nil, err
				}
				var queries [][]string
				sc := bufio.NewScanner(bytes.NewReader(data))
				for sc.Scan() {
					if f := strings.Fields(sc.Text()); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
						queries = append(queries, f)
					}
				}
				out, err := judge(queries)
				if err != nil {
					return nil, err
				}
				return func(*script.State) (string, string, error) { return out, "", nil }, nil
			}),
	}
	maps.Copy(cmds, policymap.FaultCommands(ops, "policy map", "policymap/policy-fault-probability", "policymap/policy-fail-entry", policymap.FaultKeys{
		Args:  2,
		Usage: "pod peer",
		Encode: func(args []string) ([]byte, error) {
			pod, err := netip.ParseAddr(args[0])
			if err != nil {
				return nil, err
			}
			peer, err := netip.ParsePrefix(args[1])
			if err != nil {
				return nil, err
			}
			return bpf.EncodePolicyKey(pod, peer)
		},
		Normalize: bpf.PolicyKeyVersionless,
	}))
	return hive.NewScriptCmds(cmds)
}
