package ipam_test

import (
	"testing"

	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq/cells/celltest"
)

// TestScript runs testdata/*.txtar on a netlinkfake.Netlink with links carrying the
// sample ENIs' MACs: no root needed.
func TestScript(t *testing.T) {
	celltest.Run(t, "testdata/*.txtar", func(t testing.TB) []cell.Cell {
		n := newFakeNetwork(t, false)
		return testCells(n, n.Handle())
	})
}

// TestPrivilegedScript runs the same scripts, each in a fresh network
// namespace with links carrying the sample ENIs' MACs.
func TestPrivilegedScript(t *testing.T) {
	celltest.RequireRoot(t)
	celltest.Run(t, "testdata/*.txtar", func(t testing.TB) []cell.Cell {
		n := newTestNetNS(t, false)
		return testCells(n, n.Handle())
	})
}
