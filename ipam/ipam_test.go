package ipam_test

import (
	"testing"

	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq/cells/celltest"
)

// TestPrivilegedScript runs testdata/*.txtar, each in a fresh network
// namespace with links carrying the sample ENIs' MACs.
func TestPrivilegedScript(t *testing.T) {
	celltest.RequireRoot(t)
	celltest.Run(t, "testdata/*.txtar", func(t testing.TB) []cell.Cell {
		n := newTestNetNS(t, false)
		return testCells(n, n.H)
	})
}
