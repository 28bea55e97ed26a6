package netlinkfake

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/kernel"
)

// fakeRule is a rule as the kernel keeps it (the selectors Netlink
// models). A zero field is a selector the rule does not have.
type fakeRule struct {
	family   int
	priority int
	src, dst netip.Prefix
	tos      uint
	table    int
	protocol uint8
	mark     uint32
	mask     uint32
	iif, oif string
}

// defaultRules are the kernel's rules of a new namespace (protocol kernel).
func defaultRules() []fakeRule {
	return []fakeRule{
		{family: unix.AF_INET, priority: 0, table: unix.RT_TABLE_LOCAL, protocol: unix.RTPROT_KERNEL},
		{family: unix.AF_INET, priority: 32766, table: unix.RT_TABLE_MAIN, protocol: unix.RTPROT_KERNEL},
		{family: unix.AF_INET, priority: 32767, table: unix.RT_TABLE_DEFAULT, protocol: unix.RTPROT_KERNEL},
		{family: unix.AF_INET6, priority: 0, table: unix.RT_TABLE_LOCAL, protocol: unix.RTPROT_KERNEL},
		{family: unix.AF_INET6, priority: 32766, table: unix.RT_TABLE_MAIN, protocol: unix.RTPROT_KERNEL},
	}
}

// ruleSelector is a prefix selector as the kernel reads it: a /0 is none.
func ruleSelector(p netip.Prefix) netip.Prefix {
	if !p.IsValid() || p.Bits() == 0 {
		return netip.Prefix{}
	}
	return p
}

// toFakeRule reads the selectors of r as netlink.Handle sends them; a
// priority of -1 (none) stays -1.
func toFakeRule(op string, r *netlink.Rule) (fakeRule, error) {
	switch {
	case r.Goto >= 0, r.Flow >= 0, r.TunID != 0, r.Dport != nil, r.Sport != nil, r.IPProto != 0,
		r.UIDRange != nil, r.SuppressIfgroup >= 0, r.SuppressPrefixlen >= 0, r.Invert:
		return fakeRule{}, notModelled(op, "a rule selector other than priority, from, to, tos, fwmark, iif, oif, table and protocol")
	case r.Type > unix.RTN_UNICAST:
		return fakeRule{}, notModelled(op, "a rule action other than lookup")
	}
	fr := fakeRule{
		family: r.Family, priority: r.Priority, tos: r.Tos, table: r.Table, protocol: r.Protocol,
		mark: r.Mark, iif: r.IifName, oif: r.OifName,
	}
	if r.Mask != nil {
		fr.mask = *r.Mask
	} else if r.Mark != 0 {
		fr.mask = 0xffffffff
	}
	// The family is the prefixes' (a /0 too), as netlink.Handle sends it.
	src, dst := prefixOf(r.Src), prefixOf(r.Dst)
	if dst.IsValid() {
		fr.family = familyOf(dst.Addr())
	}
	if src.IsValid() {
		if dst.IsValid() && familyOf(src.Addr()) != fr.family {
			return fakeRule{}, fmt.Errorf("fake netlink: %s: source and destination ip are not the same IP family", op)
		}
		fr.family = familyOf(src.Addr())
	}
	if fr.family == 0 {
		fr.family = unix.AF_INET
	}
	fr.src, fr.dst = ruleSelector(src), ruleSelector(dst)
	return fr, nil
}

// selectorsGiven says whether stored agrees with the prefixes and TOS that
// q gives (the kernel's fib4_rule_compare / fib6_rule_compare).
func selectorsGiven(stored, q fakeRule) bool {
	return (!q.src.IsValid() || stored.src == q.src) &&
		(!q.dst.IsValid() || stored.dst == q.dst) &&
		(q.tos == 0 || stored.tos == q.tos)
}

// sameRule is the kernel's rule_exists: every selector equal, except the
// prefixes and TOS, which count only if the new rule has them.
func sameRule(stored, q fakeRule) bool {
	return stored.family == q.family && stored.priority == q.priority && stored.table == q.table &&
		stored.protocol == q.protocol && stored.mark == q.mark && stored.mask == q.mask &&
		stored.iif == q.iif && stored.oif == q.oif && selectorsGiven(stored, q)
}

// matchesDelete is the kernel's rule_find: every selector that the delete
// gives must agree.
func matchesDelete(stored, q fakeRule) bool {
	return stored.family == q.family &&
		(q.priority < 0 || stored.priority == q.priority) &&
		(q.table == 0 || stored.table == q.table) &&
		(q.protocol == 0 || stored.protocol == q.protocol) &&
		(q.mark == 0 || stored.mark == q.mark) &&
		(q.mask == 0 || stored.mask == q.mask) &&
		(q.iif == "" || stored.iif == q.iif) &&
		(q.oif == "" || stored.oif == q.oif) &&
		selectorsGiven(stored, q)
}

// defaultPriority is the kernel's priority for a rule added without one:
// one less than the second rule's of the family, if that is not 0.
func (f *Netlink) defaultPriority(family int) int {
	seen := 0
	for _, r := range f.rules {
		if r.family != family {
			continue
		}
		if seen++; seen == 2 && r.priority > 0 {
			return r.priority - 1
		}
	}
	return 0
}

func (f *Netlink) RuleAdd(r *netlink.Rule) error {
	q, err := toFakeRule("ip rule add", r)
	if err != nil {
		return err
	}
	if q.table == 0 {
		return notModelled("ip rule add", "a rule without a table")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.priority < 0 {
		q.priority = f.defaultPriority(q.family)
	}
	if slices.ContainsFunc(f.rules, func(stored fakeRule) bool { return sameRule(stored, q) }) {
		return fmt.Errorf("fake netlink: ip rule add: %w", unix.EEXIST)
	}
	// After the last rule of a priority not above it, as the kernel
	// inserts.
	at := len(f.rules)
	for i, stored := range f.rules {
		if stored.priority > q.priority {
			at = i
			break
		}
	}
	f.rules = slices.Insert(f.rules, at, q)
	f.emit(kernel.RuleAdded, q.family)
	return nil
}

func (f *Netlink) RuleDel(r *netlink.Rule) error {
	q, err := toFakeRule("ip rule del", r)
	if err != nil {
		return err
	}
	return deleteFirst(f, &f.rules, func(stored fakeRule) bool { return matchesDelete(stored, q) },
		fmt.Errorf("fake netlink: ip rule del: %w", unix.ENOENT), kernel.RuleDeleted, q.family)
}

// RuleList lists the rules of family (0: all) as netlink.Handle parses the
// kernel's dump.
func (f *Netlink) RuleList(family int) ([]netlink.Rule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netlink.Rule
	for _, stored := range f.rules {
		if family != 0 && stored.family != family {
			continue
		}
		r := netlink.NewRule()
		r.Family = stored.family
		r.Priority = stored.priority
		r.Table = stored.table
		r.Protocol = stored.protocol
		r.Tos = stored.tos
		r.IifName, r.OifName = stored.iif, stored.oif
		if stored.mark != 0 || stored.mask != 0 {
			r.Mark = stored.mark
			mask := stored.mask
			r.Mask = &mask
		}
		if stored.src.IsValid() {
			r.Src = netipx.PrefixIPNet(stored.src)
		}
		if stored.dst.IsValid() {
			r.Dst = netipx.PrefixIPNet(stored.dst)
		}
		out = append(out, *r)
	}
	return out, nil
}
