package netpolicy

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/netpolicy/compile"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
	"github.com/enimasq/enimasq/policymap/netpolicy/enforce"
)

// enforceCells put the programs on the pods' devices (package enforce),
// fed from policy-endpoints and the policy maps.
var enforceCells = cell.Group(
	cell.ProvidePrivate(newEnforceSettings, selectedPods, kernelPolicyMaps, objectNames),
	enforce.Cell,
)

type enforceParams struct {
	cell.In

	Policy PolicyConfig
	// Audit is the standalone agent's (AuditCell): none in Cilium's.
	Audit AuditConfig `optional:"true"`
	Node  nodeconfig.Config
	Maps  policymap.MapsParams
}

// newEnforceSettings: enforcement runs with network policy on kernel maps,
// standalone; linked into Cilium, Cilium's own policy owns the pods' devices.
func newEnforceSettings(p enforceParams) enforce.Settings {
	mode, _ := policybpf.ParsePolicyMode(p.Policy.EnforcingMode) // validated with the flags
	s := enforce.Settings{
		Mode:          mode,
		Attach:        p.Policy.Attach,
		GlobalsDir:    p.Node.GlobalsDir(),
		LinksDir:      filepath.Join(p.Node.BPFRoot, "enimasq", "links"),
		CheckInterval: p.Policy.AttachCheckInterval,
		ConntrackMax:  p.Policy.PolicyConntrackMax,
		Events:        p.Policy.PolicyEventLogs,
		Audit:         p.Audit.PolicyAuditMode,
	}
	switch {
	case !p.Policy.EnableNetworkPolicy:
		s.Off, s.RemoveWhenOff = "network policy is disabled", true
	case p.Node.IPAM.Allocator == nodeconfig.AllocatorCilium:
		s.Off = "linked into Cilium: Cilium enforces its own policy on the pods' devices"
	case p.Maps.Store != nil:
		if _, kernel := p.Maps.Store.(bpf.KernelStore); !kernel {
			s.Off = "the policy maps are not kernel maps"
		}
	}
	return s
}

// selectedPods are the pod IPs of policy-endpoints.
func selectedPods(table statedb.Table[*endpoints.PolicyEndpoint]) enforce.SelectedPods {
	return func(txn statedb.ReadTxn) ([]netip.Addr, bool, <-chan struct{}) {
		if ok, initWatch := table.Initialized(txn); !ok {
			return nil, false, initWatch
		}
		pes, watch := table.AllWatch(txn)
		var out []netip.Addr
		for pe := range pes {
			for _, p := range pe.Pods {
				out = append(out, p.PodIP)
			}
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return slices.Compact(out), true, watch
	}
}

// kernelPolicyMaps are the policy and cluster maps the reconcilers write,
// with their chunk maps, once open.
func kernelPolicyMaps(ops compile.KernelMaps) enforce.PolicyMaps {
	return func(context.Context) (map[string]*ebpf.Map, error) {
		maps, ok := bpf.KernelMaps(ops.Opened())
		if !ok {
			return nil, errors.New("the policy maps are not open")
		}
		// Without the versions map a program would look every pod's keys
		// up at version 0: no policy.
		if maps[policybpf.PolicyVersionsMapName] == nil {
			return nil, errors.New(policybpf.PolicyVersionsMapName + " is not open")
		}
		return maps, nil
	}
}
