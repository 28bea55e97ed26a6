package source

import (
	"fmt"
	"maps"
	"slices"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// mergeClusters returns the ClusterPolicyEndpoints of all files by name,
// and the warnings to add to them: an object defined in two files is taken
// from the first by name, with a warning.
func mergeClusters(names []string, files map[string]*policyFile) (map[string]*ClusterPolicyEndpoint, map[string][]string) {
	desired, extra := map[string]*ClusterPolicyEndpoint{}, map[string][]string{}
	for _, name := range names {
		f := files[name]
		if f == nil {
			continue
		}
		for _, cpe := range f.clusters {
			if _, dup := desired[cpe.Name]; dup {
				extra[cpe.Name] = append(extra[cpe.Name], fmt.Sprintf("also defined in %s: that copy is ignored", cpe.File))
				continue
			}
			desired[cpe.Name] = cpe
		}
	}
	return desired, extra
}

// clusterInput is the rows of desired, sorted by name, each as this node
// programs it (forNode) with extra added (to a copy: the object may be a
// last good version), and all their warnings, each prefixed with its name;
// their unknown fields are named (unknown.go).
func (s *policySource) clusterInput(desired map[string]*ClusterPolicyEndpoint, extra map[string][]string) *filesource.Input[*ClusterPolicyEndpoint] {
	in := &filesource.Input[*ClusterPolicyEndpoint]{}
	unknown := map[string][]string{}
	for _, name := range slices.Sorted(maps.Keys(desired)) {
		cpe := forNode(desired[name], s.node)
		unknown[name] = cpe.Unknown
		if more := extra[name]; len(more) > 0 {
			c := *cpe
			c.Warnings = append(slices.Clone(cpe.Warnings), more...)
			cpe = &c
		}
		for _, w := range cpe.Warnings {
			in.Warnings = append(in.Warnings, name+": "+w)
		}
		in.Rows = append(in.Rows, cpe)
	}
	in.Note = s.clusterUnknown.note(s.Log, unknown)
	return in
}

// forNode is cpe without what this node does not program, each item
// dropped with a warning on the row: the pod IPs and the rules of a family
// it does not run (an IPv6 cidr on an IPv4-only node is inert: never an
// error, never encoded). cpe itself is returned when nothing is dropped.
func forNode(cpe *ClusterPolicyEndpoint, node nodeconfig.Config) *ClusterPolicyEndpoint {
	var warnings []string
	pods := slices.DeleteFunc(slices.Clone(cpe.Pods), func(p PodEndpoint) bool {
		if node.FamilyEnabled(p.PodIP) {
			return false
		}
		warnings = append(warnings, fmt.Sprintf("spec.podSelectorEndpoints: podIP %s: %s: dropped", p.PodIP, familyDisabled(p.PodIP)))
		return true
	})
	rules := func(d bpf.Direction, in []ClusterRule) []ClusterRule {
		var out []ClusterRule
		for _, r := range in {
			if node.FamilyEnabled(r.CIDR.Addr()) {
				out = append(out, r)
				continue
			}
			warnings = append(warnings, fmt.Sprintf("spec.%s: cidr %s (%s): %s: rule dropped", d, r.CIDR, r.Action, familyDisabled(r.CIDR.Addr())))
		}
		return out
	}
	ingress, egress := rules(bpf.Ingress, cpe.Ingress), rules(bpf.Egress, cpe.Egress)
	if len(warnings) == 0 {
		return cpe
	}
	c := *cpe
	c.Pods, c.Ingress, c.Egress = pods, ingress, egress
	c.Warnings = append(slices.Clone(cpe.Warnings), warnings...)
	return &c
}
