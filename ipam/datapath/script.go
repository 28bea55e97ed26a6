package datapath

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"

	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/cells/nldump"
	"github.com/enimasq/enimasq/cells/prefixorder"
	"github.com/enimasq/enimasq/cells/scriptcmd"
)

// KernelRules prints the kernel's rules with enimasq's protocol, one a line
// in `ip rule` format (without "proto"), sorted by priority, source,
// destination and table. A rule of enimasq's protocol with other selectors
// is printed with "(other selectors)".
func KernelRules(nl Netlink, families []int) (string, error) {
	rules, err := ListRules(nl, families)
	if err != nil {
		return "", err
	}
	type line struct {
		k    RuleKey
		text string
	}
	lines := make([]line, 0, len(rules))
	for i := range rules {
		k, plain := ruleKeyOf(&rules[i])
		text := formatRule(k)
		if !plain {
			text += " (other selectors)"
		}
		lines = append(lines, line{k, text})
	}
	slices.SortStableFunc(lines, func(a, b line) int {
		if c := cmp.Compare(a.k.Priority, b.k.Priority); c != 0 {
			return c
		}
		if c := prefixorder.Compare(a.k.From, b.k.From); c != 0 {
			return c
		}
		if c := prefixorder.Compare(a.k.To, b.k.To); c != 0 {
			return c
		}
		return cmp.Compare(a.k.Table, b.k.Table)
	})
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.text)
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// KernelRoutes prints the kernel's routes with enimasq's protocol, one a
// line: "table 11: default via 10.130.96.1 dev eni1", sorted by table and
// destination.
func KernelRoutes(nl Netlink, families []int) (string, error) {
	routes, err := ListRoutes(nl, families)
	if err != nil {
		return "", err
	}
	links, err := nldump.List("ip link list", nl.LinkList)
	if err != nil {
		return "", err
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	slices.SortFunc(routes, func(a, b netlink.Route) int {
		if c := cmp.Compare(a.Table, b.Table); c != 0 {
			return c
		}
		return prefixorder.Compare(routeKeyOf(&a).Dst, routeKeyOf(&b).Dst)
	})
	var b strings.Builder
	for i := range routes {
		r := &routes[i]
		fmt.Fprintf(&b, "table %d: %s", r.Table, routeDst(routeKeyOf(r).Dst))
		if r.Gw != nil {
			fmt.Fprintf(&b, " via %s", r.Gw)
		}
		if name, ok := names[r.LinkIndex]; ok {
			fmt.Fprintf(&b, " dev %s", name)
		}
		if r.Scope == netlink.SCOPE_LINK {
			b.WriteString(" scope link")
		}
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// scriptCommands are the part's shell and script-test commands: the kernel
// state (not the tables).
func scriptCommands(nl *nlHandle) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"ipam/rules": scriptcmd.List("List the kernel's ip rules with enimasq's protocol ("+fmt.Sprint(RTProto)+")",
			nil, func(*script.State) (string, error) { return KernelRules(nl, nl.families) }),
		"ipam/rules-cmp": scriptcmd.Cmp("Wait until the kernel's ip rules with enimasq's protocol list as the file says (ipam/rules)",
			"ip rules", nil, func(*script.State) (string, error) { return KernelRules(nl, nl.families) }),
		"ipam/routes": scriptcmd.List("List the kernel's routes with enimasq's protocol, in every table",
			nil, func(*script.State) (string, error) { return KernelRoutes(nl, nl.families) }),
		"ipam/routes-cmp": scriptcmd.Cmp("Wait until the kernel's routes with enimasq's protocol list as the file says (ipam/routes)",
			"routes", nil, func(*script.State) (string, error) { return KernelRoutes(nl, nl.families) }),
	})
}
