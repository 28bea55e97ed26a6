package masqmap_test

import (
	"testing"

	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/maptest"
	"github.com/enimasq/enimasq/policymap/masqmap"
)

// TestScript runs testdata/*.txtar on fake maps: no root needed.
func TestScript(t *testing.T) {
	maptest.RunFake(t, ipmasq.Cell, policymap.Module(masqmap.Cell))
}

// TestPrivilegedScript runs the same scripts on kernel maps.
func TestPrivilegedScript(t *testing.T) {
	maptest.RunKernel(t, ipmasq.Cell, policymap.Module(masqmap.Cell))
}
