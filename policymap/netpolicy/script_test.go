package netpolicy_test

import (
	"testing"

	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/maptest"
	"github.com/enimasq/enimasq/policymap/netpolicy"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// TestScript runs testdata/*.txtar on fake maps: no root needed. The
// verdicts come from the entries (JudgePacket's model of c/policy.c).
//
// The objects of these scripts are written by hand, in files, where the
// AWS network policy controller cannot make the case: the file source
// itself (directories, documents, lists, both kinds in one file), values
// it never writes (bad cidrs, ports, tiers, names; unreadable documents)
// and the stand-ins they make, exact prefixes and port lists at the edges
// of the encoding (except chains, 1,000 ports, families the node does not
// run), and slices cut by hand to name each shape. What the controller
// does write, from real NetworkPolicies, ClusterNetworkPolicies and
// ApplicationNetworkPolicies, is judged by test.TestPrivilegedAWSController
// (test/awsctl_*_test.go) against a reference of the APIs' semantics.
func TestScript(t *testing.T) {
	maptest.RunFake(t, kernel.Cell, ipmasq.Cell, policymap.Module(netpolicy.Cell, endpoints.DNSNamesCell))
}

// TestPrivilegedScript runs the same scripts on kernel maps, the verdicts
// from the policy program.
func TestPrivilegedScript(t *testing.T) {
	maptest.RunKernel(t, kernel.Cell, ipmasq.Cell, policymap.Module(netpolicy.Cell, endpoints.DNSNamesCell))
}
