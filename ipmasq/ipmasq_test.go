package ipmasq_test

import (
	"testing"

	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/ipmasq"
)

func TestScript(t *testing.T) {
	celltest.Run(t, "testdata/*.txtar", func(testing.TB) []cell.Cell {
		return []cell.Cell{ipmasq.Cell}
	})
}
