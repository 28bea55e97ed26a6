package policymap_test

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/policymap"
)

func TestPrivilegedScript(t *testing.T) {
	celltest.RequireRoot(t)
	celltest.Run(t, "testdata/*.txtar", func(testing.TB) []cell.Cell {
		return []cell.Cell{ipmasq.Cell, policymap.Cell, behindTheBackCommands}
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
	return hive.NewScriptCmds(map[string]script.Cmd{
		"raw/delete": rawOp(true),
		"raw/put":    rawOp(false),
	})
})
