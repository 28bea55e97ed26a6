package masqmap_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/masqmap"
)

func TestPrivilegedScript(t *testing.T) {
	celltest.RequireRoot(t)
	celltest.Run(t, "testdata/*.txtar", func(testing.TB) []cell.Cell {
		return []cell.Cell{ipmasq.Cell, policymap.Module(masqmap.Cell), behindTheBackCommands}
	})
}

// behindTheBackCommands change a pinned map directly, as another program on
// the node would: the agent has to notice.
var behindTheBackCommands = cell.Provide(func(node nodeconfig.Config) hive.ScriptCmdsOut {
	rawOp := func(del bool) script.Cmd {
		return script.Command(
			script.CmdUsage{Summary: "Change a pinned ipmasq map behind the agent's back", Args: "map prefix"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, script.ErrUsage
				}
				m, err := ebpf.LoadPinnedMap(filepath.Join(node.GlobalsDir(), args[0]), nil)
				if err != nil {
					return nil, err
				}
				defer m.Close()
				key, err := bpf.EncodePrefix(netip.MustParsePrefix(args[1]))
				if err != nil {
					return nil, err
				}
				if del {
					return nil, m.Delete(key)
				}
				return nil, m.Put(key, bpf.IPMasqValue())
			})
	}
	path := func(name string) string { return filepath.Join(node.GlobalsDir(), name) }
	return hive.NewScriptCmds(map[string]script.Cmd{
		"raw/delete": rawOp(true),
		"raw/put":    rawOp(false),
		"raw/unpin": script.Command(
			script.CmdUsage{Summary: "Remove a map's pin behind the agent's back", Args: "map"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				return nil, os.Remove(path(args[0]))
			}),
		"raw/pin-foreign": script.Command(
			script.CmdUsage{Summary: "Pin an LPM map with 12-byte keys in place of a map", Args: "map"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				os.Remove(path(args[0]))
				m, err := ebpf.NewMap(bpf.LPMSpec("foreign", 12, 1, 16))
				if err != nil {
					return nil, err
				}
				defer m.Close()
				return nil, m.Pin(path(args[0]))
			}),
		"raw/wait-pinned": script.Command(
			script.CmdUsage{Summary: "Wait (at most the duration) until the pinned map, read by its path, holds exactly these prefixes", Args: "duration map prefix..."},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) < 2 {
					return nil, script.ErrUsage
				}
				within, err := time.ParseDuration(args[0])
				if err != nil {
					return nil, err
				}
				deadline := time.After(within)
				args = args[1:]
				want := strings.Join(args[1:], " ")
				got := ""
				for {
					if m, err := ebpf.LoadPinnedMap(path(args[0]), nil); err == nil {
						fam := bpf.IPv4
						if strings.HasSuffix(args[0], "_v6") {
							fam = bpf.IPv6
						}
						prefixes, err := policymap.ListPrefixes(m, fam)
						m.Close()
						if err == nil {
							var ps []string
							for _, p := range prefixes {
								ps = append(ps, p.String())
							}
							if got = strings.Join(ps, " "); got == want {
								return nil, nil
							}
						}
					} else {
						got = err.Error()
					}
					// The kernel has no notification for a pin: poll it.
					select {
					case <-s.Context().Done():
						return nil, fmt.Errorf("pinned %s is %q, want %q", args[0], got, want)
					case <-deadline:
						return nil, fmt.Errorf("pinned %s is still %q after %s, want %q", args[0], got, within, want)
					case <-time.After(20 * time.Millisecond):
					}
				}
			}),
	})
})
