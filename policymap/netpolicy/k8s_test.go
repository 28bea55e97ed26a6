package netpolicy_test

import (
	"context"
	"maps"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/nodeips"
	"github.com/enimasq/enimasq/policymap/netpolicy"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"
	"golang.org/x/tools/txtar"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/test/k8stest"
)

// TestPrivilegedK8sScripts runs testdata/k8s/*.txtar, each against its own
// real API server ($KUBECONFIG, and the k8s/... commands of k8stest), with
// the PolicyEndpoints from the API. This node's addresses are 192.168.0.1
// and 192.168.0.3 (instead of the interfaces' addresses). $DEPLOY is
// Documentation/deploy, whose manifests (the ClusterPolicyEndpoint CRD) a
// script may apply.
func TestPrivilegedK8sScripts(t *testing.T) {
	celltest.RequireRoot(t)
	deploy, err := filepath.Abs(filepath.Join("..", "..", "Documentation", "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	k8stest.Scripts(t, "testdata/k8s/*.txtar", func(t *testing.T, c *k8stest.Cluster, file string, archive *txtar.Archive, args []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		t.Cleanup(cancel)
		work := t.TempDir()
		s, err := script.NewState(ctx, work, []string{"WORK=" + work, "KUBECONFIG=" + c.Kubeconfig, "DEPLOY=" + deploy})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ExtractFiles(archive); err != nil {
			t.Fatal(err)
		}
		e := celltest.NewEngine(t, args, k8sclient.Cell, kernel.Cell, nodeips.Cell, testNodeIPs, ipmasq.Cell, policymap.Module(netpolicy.Cell))
		maps.Copy(e.Cmds, c.ScriptCommands())
		celltest.RunScript(t, e, s, file, archive)
	})
}

// testNodeIPs makes 192.168.0.1 and 192.168.0.3 this node's addresses, as
// a source of node-ips beside the interfaces' addresses.
var testNodeIPs = cell.Invoke(func(db *statedb.DB, table statedb.RWTable[*nodeips.NodeIP]) {
	wtxn := db.WriteTxn(table)
	nodeips.Sync(wtxn, table, "test", []*nodeips.NodeIP{
		{Addr: netip.MustParseAddr("192.168.0.1"), Source: "test"},
		{Addr: netip.MustParseAddr("192.168.0.3"), Source: "test"},
	})
	wtxn.Commit()
})

// TestSourceConflictAtStart: --policy-endpoints-path with an enabled API
// client stops the hive at start, naming both.
func TestSourceConflictAtStart(t *testing.T) {
	kubeconfig := k8stest.UnreachableKubeconfig(t)
	h := infra.New(infra.Core, infra.NodeConfigCell, k8sclient.Cell, kernel.Cell, nodeips.Cell, ipmasq.Cell, policymap.Module(netpolicy.Cell))
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	if err := flags.Parse([]string{"--k8s-kubeconfig-path=" + kubeconfig, "--k8s-node-name=node-1",
		"--enable-network-policy", "--policy-endpoints-path=/pe", "--state-dir=" + t.TempDir(), "--bpf-root=" + t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	err := h.Populate(hivetest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "--policy-endpoints-path /pe is set and the Kubernetes API server is enabled (kubeconfig "+kubeconfig+")") {
		t.Fatalf("populate: %v", err)
	}
}
