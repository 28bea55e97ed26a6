package netpolicy_test

import (
	"testing"

	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/maptest"
	"github.com/enimasq/enimasq/policymap/netpolicy"
)

// TestScript runs testdata/*.txtar on fake maps: no root needed. The
// verdicts come from the entries (JudgePacket's model of c/policy.c).
func TestScript(t *testing.T) {
	maptest.RunFake(t, ipmasq.Cell, policymap.Module(netpolicy.Cell))
}

// TestPrivilegedScript runs the same scripts on kernel maps, the verdicts
// from the policy program.
func TestPrivilegedScript(t *testing.T) {
	maptest.RunKernel(t, ipmasq.Cell, policymap.Module(netpolicy.Cell))
}
