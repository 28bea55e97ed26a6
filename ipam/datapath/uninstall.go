package datapath

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// Uninstall deletes every ip rule and route with enimasq's protocol
// (RTProto) in nl's namespace, both families, with no agent running
// (enimasq-dbg cleanup). Rules and routes of any other protocol (aws-node,
// Cilium, the operator) are never touched. It returns what it deleted,
// one line each; a second call finds nothing.
func Uninstall(nl Netlink) ([]string, error) {
	families := []int{netlink.FAMILY_V4, netlink.FAMILY_V6}
	var removed []string
	// A delete matches on what it names (a rule without a destination
	// matches the first of its priority, source and table, protocol
	// 237 as well), so rounds go on until the list is empty.
	for range 10 {
		rules, err := ListRules(nl, families)
		if err != nil {
			return removed, err
		}
		routes, err := ListRoutes(nl, families)
		if err != nil {
			return removed, err
		}
		if len(rules) == 0 && len(routes) == 0 {
			return removed, nil
		}
		var errs []error
		for i := range rules {
			r := &rules[i]
			if err := nl.RuleDel(r); err != nil && !isGone(err) {
				errs = append(errs, fmt.Errorf("ip rule del %s proto %d: %w", r, r.Protocol, err))
				continue
			}
			removed = append(removed, fmt.Sprintf("ip rule %d: %s proto %d", r.Priority, ruleText(r), r.Protocol))
		}
		for i := range routes {
			r := &routes[i]
			if err := nl.RouteDel(r); err != nil && !isGone(err) {
				errs = append(errs, fmt.Errorf("ip route del %s table %d proto %d: %w", routeText(r), r.Table, r.Protocol, err))
				continue
			}
			removed = append(removed, fmt.Sprintf("ip route %s table %d proto %d", routeText(r), r.Table, r.Protocol))
		}
		if err := errors.Join(errs...); err != nil {
			return removed, err
		}
	}
	return removed, fmt.Errorf("rules or routes with protocol %d are still there after 10 rounds of deletes", RTProto)
}

func ruleText(r *netlink.Rule) string {
	s := "from all"
	if r.Src != nil {
		s = "from " + r.Src.String()
	}
	if r.Dst != nil {
		s += " to " + r.Dst.String()
	}
	return fmt.Sprintf("%s lookup %d", s, r.Table)
}

func routeText(r *netlink.Route) string {
	dst := "default"
	if r.Dst != nil {
		dst = r.Dst.String()
	}
	if r.Gw != nil {
		dst += " via " + r.Gw.String()
	}
	return dst
}
