package allocator

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"
)

// scriptCommands are the allocator's shell and script-test commands.
func scriptCommands(alloc *Allocator) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"ipam/allocate": script.Command(
			script.CmdUsage{
				Summary: "Allocate an IP for a pod and print the result (an error goes to stderr too)",
				Args:    "namespace/pod",
				Flags: func(fs *pflag.FlagSet) {
					fs.String("ip", "", "Ask for this IP")
					fs.String("family", "", "ipv4 (default) or ipv6")
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				ip, _ := s.Flags.GetString("ip")
				family, _ := s.Flags.GetString("family")
				return func(*script.State) (string, string, error) {
					result, _, err := alloc.Allocate(Request{Owner: args[0], Family: family, IP: ip})
					if err != nil {
						return "", err.Error() + "\n", err
					}
					out, err := json.MarshalIndent(result, "", "  ")
					return string(out) + "\n", "", err
				}, nil
			}),
		"ipam/release": script.Command(
			script.CmdUsage{Summary: "Release an allocated IP (an error goes to stderr too)", Args: "ip"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				ip, err := netip.ParseAddr(args[0])
				if err != nil {
					return nil, err
				}
				return func(*script.State) (string, string, error) {
					held, err := alloc.Release(ip)
					if err != nil {
						return "", err.Error() + "\n", err
					}
					return fmt.Sprintf("released %s (%s)\n", held.IP, held.Owner), "", nil
				}, nil
			}),
	})
}
