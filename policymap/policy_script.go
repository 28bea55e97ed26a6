package policymap

import (
	"bufio"
	"bytes"
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

// ParseVerdictQuery parses "direction pod peer protocol [port]", e.g.
// "egress 10.0.0.5 10.1.2.3 udp 53". The port is required for TCP, UDP and
// SCTP and refused for other protocols.
func ParseVerdictQuery(args []string) (VerdictQuery, error) {
	if len(args) < 4 || len(args) > 5 {
		return VerdictQuery{}, fmt.Errorf("%q: want \"direction pod peer protocol [port]\"", strings.Join(args, " "))
	}
	var q VerdictQuery
	var err error
	if q.Direction, err = bpf.ParseDirection(args[0]); err != nil {
		return q, err
	}
	if q.Pod, err = netip.ParseAddr(args[1]); err != nil {
		return q, fmt.Errorf("pod: %w", err)
	}
	if q.Peer, err = netip.ParseAddr(args[2]); err != nil {
		return q, fmt.Errorf("peer: %w", err)
	}
	if q.Protocol, err = bpf.ParseProtocol(args[3]); err != nil {
		return q, err
	}
	switch {
	case portKnown(q.Protocol) && len(args) != 5:
		return q, fmt.Errorf("protocol %s needs a port", args[3])
	case !portKnown(q.Protocol) && len(args) == 5:
		return q, fmt.Errorf("protocol %s has no ports", args[3])
	case len(args) == 5:
		port, err := strconv.ParseUint(args[4], 10, 16)
		if err != nil || port == 0 {
			return q, fmt.Errorf("port %q: want 1..65535", args[4])
		}
		q.Port = uint16(port)
	}
	return q, nil
}

// policyScriptCommands are the shell and script-test commands of the
// network-policy maps: they read the kernel maps (not the tables), run the
// verdict program on them, and inject faults.
func policyScriptCommands(ops *mapOps[*PolicyMapEntry]) hive.ScriptCmdsOut {
	podFlag := func(fs *pflag.FlagSet) { fs.String("pod", "", "Only the entries of this pod IP") }
	podOf := func(s *script.State) (netip.Addr, error) {
		v, err := s.Flags.GetString("pod")
		if err != nil || v == "" {
			return netip.Addr{}, err
		}
		return netip.ParseAddr(v)
	}
	judge := func(queries [][]string) (string, error) {
		prog, err := bpf.LoadPolicyProgram(ops.openMaps())
		if err != nil {
			return "", err
		}
		defer prog.Close()
		var out strings.Builder
		for _, args := range queries {
			q, err := ParseVerdictQuery(args)
			if err != nil {
				return "", err
			}
			v, err := JudgePacket(prog, ops.openMaps(), q)
			if err != nil {
				return "", err
			}
			fmt.Fprintln(&out, v)
		}
		return out.String(), nil
	}

	return hive.NewScriptCmds(map[string]script.Cmd{
		"policymap/policy-list": script.Command(
			script.CmdUsage{
				Summary: "List the network-policy maps, read from the kernel: \"map pod peer ports\" per entry",
				Flags:   podFlag,
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				pod, err := podOf(s)
				if err != nil {
					return nil, err
				}
				return func(*script.State) (string, string, error) {
					out, err := ListPolicyMaps(ops.openMaps(), pod)
					return out, "", err
				}, nil
			}),
		"policymap/policy-cmp": script.Command(
			script.CmdUsage{
				Summary: "Wait until the kernel's network-policy maps list exactly as the file says",
				Args:    "file",
				Flags: func(fs *pflag.FlagSet) {
					podFlag(fs)
					fs.Duration("timeout", 5*time.Second, "How long to wait for the maps to match")
				},
				Detail: []string{
					"The maps are read every 10ms until they match the file (the",
					"format of policymap/policy-list) or the timeout passes.",
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				pod, err := podOf(s)
				if err != nil {
					return nil, err
				}
				timeout, err := s.Flags.GetDuration("timeout")
				if err != nil {
					return nil, err
				}
				return nil, waitKernelMatches(s, args[0], timeout, "policy maps", func() (string, error) {
					return ListPolicyMaps(ops.openMaps(), pod)
				})
			}),
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
		"policymap/policy-fault-probability": script.Command(
			script.CmdUsage{Summary: "Make this fraction of policy map operations fail", Args: "probability"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				p, err := strconv.ParseFloat(args[0], 64)
				if err != nil {
					return nil, err
				}
				ops.faults.SetProbability(p)
				return nil, nil
			}),
		"policymap/policy-fail-entry": script.Command(
			script.CmdUsage{
				Summary: "Make operations on these policy map entries fail (none: stop)",
				Args:    "[pod peer]...",
				Detail:  []string{"Each pair names the entry of a pod IP and a peer prefix, in either direction's map."},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args)%2 != 0 {
					return nil, script.ErrUsage
				}
				failing := map[string]bool{}
				for i := 0; i < len(args); i += 2 {
					pod, err := netip.ParseAddr(args[i])
					if err != nil {
						return nil, err
					}
					peer, err := netip.ParsePrefix(args[i+1])
					if err != nil {
						return nil, err
					}
					key, err := bpf.EncodePolicyKey(pod, peer)
					if err != nil {
						return nil, err
					}
					failing[string(key)] = true
				}
				if len(failing) == 0 {
					ops.faults.SetFaultFunc(nil)
					return nil, nil
				}
				ops.faults.SetFaultFunc(func(_ string, key []byte) error {
					if failing[string(key)] {
						return fmt.Errorf("injected: key refused")
					}
					return nil
				})
				return nil, nil
			}),
	})
}
