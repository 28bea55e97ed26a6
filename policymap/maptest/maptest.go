// Package maptest runs the map features' script tests twice, as Cilium's
// loadbalancer does: on fake maps ([RunFake]: any user, bpffake.FakeStore) and
// on the kernel's ([RunKernel]: root, a private bpffs). The same txtar
// files pass on both; the fakes behave as the kernel does where the
// features look (see bpffake.FakeStore). Its raw/... commands act on the maps
// behind the agent's back, through the same store.
package maptest

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/bpffake"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap"
)

// RunFake runs testdata/*.txtar on fake maps, each script with a store of
// its own and the given cells.
func RunFake(t *testing.T, cells ...cell.Cell) {
	celltest.RunWithoutBPFFS(t, "testdata/*.txtar", func(testing.TB) []cell.Cell {
		store := bpffake.NewFakeStore()
		return append([]cell.Cell{cell.Provide(func() bpf.MapStore { return store }), RawCommands}, cells...)
	})
}

// RunKernel runs testdata/*.txtar on kernel maps in a private bpffs; it
// needs root.
func RunKernel(t *testing.T, cells ...cell.Cell) {
	celltest.RequireRoot(t)
	celltest.Run(t, "testdata/*.txtar", func(testing.TB) []cell.Cell {
		return append([]cell.Cell{cell.Provide(func() bpf.MapStore { return bpf.KernelStore{} }), RawCommands}, cells...)
	})
}

// RawCommands change pinned maps directly, as another program on the node
// would: the agent has to notice.
var RawCommands = cell.Provide(rawCommands)

func rawCommands(node nodeconfig.Config, store bpf.MapStore) hive.ScriptCmdsOut {
	path := func(name string) string { return filepath.Join(node.GlobalsDir(), name) }
	rawOp := func(del bool) script.Cmd {
		return script.Command(
			script.CmdUsage{Summary: "Change a pinned ipmasq map behind the agent's back", Args: "map prefix"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, script.ErrUsage
				}
				m, err := store.LoadPinned(path(args[0]))
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
		"raw/unpin": script.Command(
			script.CmdUsage{Summary: "Remove a map's pin behind the agent's back", Args: "map"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				return nil, store.Unpin(path(args[0]))
			}),
		"raw/pin-foreign": script.Command(
			script.CmdUsage{Summary: "Pin an LPM map with 12-byte keys in place of a map", Args: "map"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				m, err := store.Create(bpf.LPMSpec("foreign", 12, 1, 16))
				if err != nil {
					return nil, err
				}
				defer m.Close()
				return nil, store.Pin(m, path(args[0]))
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
				name, want := args[1], strings.Join(args[2:], " ")
				got := ""
				for {
					if got = pinnedPrefixes(store, path(name)); got == want {
						return nil, nil
					}
					// A pin has no change notification: poll it.
					select {
					case <-s.Context().Done():
						return nil, fmt.Errorf("pinned %s is %q, want %q", name, got, want)
					case <-deadline:
						return nil, fmt.Errorf("pinned %s is still %q after %s, want %q", name, got, within, want)
					case <-time.After(20 * time.Millisecond):
					}
				}
			}),
	})
}

// pinnedPrefixes lists the prefixes of the map pinned at path, space
// separated, or says why it cannot.
func pinnedPrefixes(store bpf.MapStore, path string) string {
	m, err := store.LoadPinned(path)
	if err != nil {
		return err.Error()
	}
	defer m.Close()
	fam := bpf.IPv4
	if strings.HasSuffix(path, "_v6") {
		fam = bpf.IPv6
	}
	prefixes, err := policymap.ListPrefixes(m, fam)
	if err != nil {
		return err.Error()
	}
	ps := make([]string, len(prefixes))
	for i, p := range prefixes {
		ps[i] = p.String()
	}
	return strings.Join(ps, " ")
}
