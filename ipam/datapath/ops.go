package datapath

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"slices"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/nldump"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
)

// ownsRule says whether a kernel rule is one that enimasq writes and may
// prune.
//
// With a protocol of its own, every rule with it is. A shared protocol
// (Cilium's pod rules carry RTPROT_KERNEL, as do the kernel's own rules 0:
// local, 32766: main, 32767: default, and other writers'): only a pod's
// egress rule in the pod shape is enimasq's to keep in step: the egress
// priority, from a single address, an ENI table, and no other selector.
func (s Settings) ownsRule(r *netlink.Rule) bool {
	if int(r.Protocol) != s.PodRules.Protocol {
		return false
	}
	if !s.SharedProtocol {
		return true
	}
	k, plain := ruleKeyOf(r)
	return plain && k.Priority == s.PodRules.EgressPriority &&
		k.From.IsValid() && k.From.IsSingleIP() &&
		k.Table >= s.PodRules.TableOffset && k.Table <= s.PodRules.TableOffset+ciliumnode.MaxENINumber
}

// ruleOps reconciles eni-rules with ip rules.
type ruleOps struct {
	nl       *nlHandle
	settings Settings
	rules    statedb.Table[*Rule]
}

func (o *ruleOps) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, r *Rule) error {
	err := o.nl.RuleAdd(netlinkRule(r.RuleKey, r.Family(), o.settings.PodRules.Protocol))
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ip rule add %q: %w", r.IPRule(), err)
	}
	// EEXIST is not proof: the kernel compares only the selectors the new
	// rule has, so "from <pod> lookup 11" exists for it as soon as any rule
	// of that priority, source and table does, with a destination or not.
	present, blocking, err := o.exact(r.RuleKey, r.Family())
	switch {
	case err != nil:
		return err
	case present:
		return nil
	}
	// A rule of ours that no row desires (the pruning deletes it, then the
	// retry adds this one), or another writer's.
	return fmt.Errorf("ip rule add %q: the kernel takes %q for the same rule (a rule without a destination "+
		"matches every rule of its priority, source and table): not added until that one is gone", r.IPRule(), blocking)
}

// exact says whether the kernel holds exactly the rule of k, with our
// protocol; if not, blocking is a rule of the same priority, source and table.
func (o *ruleOps) exact(k RuleKey, family int) (present bool, blocking string, err error) {
	rules, err := nldump.List("ip rule list", func() ([]netlink.Rule, error) { return o.nl.RuleList(family) })
	if err != nil {
		return false, "", fmt.Errorf("ip rule list: %w", err)
	}
	for i := range rules {
		got, plain := ruleKeyOf(&rules[i])
		switch {
		case plain && got == k && int(rules[i].Protocol) == o.settings.PodRules.Protocol:
			return true, "", nil
		case got.Priority == k.Priority && got.From == k.From && got.Table == k.Table:
			blocking = formatRule(got)
		}
	}
	return false, blocking, nil
}

func (o *ruleOps) Delete(_ context.Context, txn statedb.ReadTxn, _ statedb.Revision, r *Rule) error {
	if !o.settings.IngressRules {
		if _, _, desired := o.rules.Get(txn, RulePodIndex.Query(r.Pod)); !desired {
			// No rule of the IP is desired any more: it is no longer
			// allocated. Its rules go once the CNI no longer routes to it:
			// Cilium removes an endpoint's ingress rule before it drops
			// the endpoint, so while the ingress rule is there the IP is
			// in use (a new pod that got the IP, its endpoint not created
			// yet). The delete fails and is retried with backoff
			// meanwhile, and health says why.
			alive, err := o.podRouted(r.Pod)
			if err != nil {
				return err
			}
			if alive {
				return fmt.Errorf("ip rule del %q: %s is no longer allocated, "+
					"but the CNI still routes to it (its priority-%d rule is in place): kept until that rule goes",
					r.IPRule(), r.Pod, o.settings.PodRules.IngressPriority)
			}
		}
	}
	err := o.nl.RuleDel(netlinkRule(r.RuleKey, r.Family(), o.settings.PodRules.Protocol))
	if err == nil || isGone(err) {
		return nil
	}
	return fmt.Errorf("ip rule del %q: %w", r.IPRule(), err)
}

// podRouted says whether the CNI's ingress rule of pod ("20:
// to <pod> lookup main", any protocol) is in the kernel.
func (o *ruleOps) podRouted(pod netip.Addr) (bool, error) {
	rules, err := nldump.List("ip rule list", func() ([]netlink.Rule, error) { return o.nl.RuleList(addrFamily(pod)) })
	if err != nil {
		return false, fmt.Errorf("ip rule list: %w", err)
	}
	return o.settings.routed(rules)[pod], nil
}

// routed are the IPs that have an ingress rule ("<prio>: to <ip> lookup
// main", any protocol) among rules.
func (s Settings) routed(rules []netlink.Rule) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for i := range rules {
		k, _ := ruleKeyOf(&rules[i])
		if k.Priority == s.PodRules.IngressPriority && k.Table == MainTable && !k.From.IsValid() && k.To.IsValid() && k.To.IsSingleIP() {
			out[k.To.Addr()] = true
		}
	}
	return out
}

// Prune deletes the kernel rules enimasq owns (ownsRule) that no row
// desires. Rules of any other protocol or shape are never looked at twice.
//
// When the ingress rules are the CNI's (Settings.IngressRules off), the
// owned rules are pruned for the IPs with desired rules, and for IPs the CNI
// no longer routes to (no ingress rule): what an endpoint's deletion, or a
// restart after an edit, left behind. An IP it routes to without desired
// rules (a pod between cilium-cni's ADD and its endpoint) keeps the rules
// cilium-cni wrote.
func (o *ruleOps) Prune(_ context.Context, _ statedb.ReadTxn, objects iter.Seq2[*Rule, statedb.Revision]) error {
	desired := map[RuleKey]bool{}
	desiredPods := map[netip.Addr]bool{}
	for r := range objects {
		desired[r.RuleKey] = true
		desiredPods[r.Pod] = true
	}
	var all []netlink.Rule
	for _, fam := range o.nl.families {
		rules, err := nldump.List("ip rule list", func() ([]netlink.Rule, error) { return o.nl.RuleList(fam) })
		if err != nil {
			return fmt.Errorf("ip rule list: %w", err)
		}
		all = append(all, rules...)
	}
	inScope := func(netip.Addr) bool { return true }
	if !o.settings.IngressRules {
		routed := o.settings.routed(all)
		inScope = func(ip netip.Addr) bool { return desiredPods[ip] || !routed[ip] }
	}
	rules := slices.DeleteFunc(all, func(r netlink.Rule) bool { return !o.settings.ownsRule(&r) })
	slices.SortStableFunc(rules, func(a, b netlink.Rule) int { return a.Priority - b.Priority })
	var (
		errs  []error
		loose []netlink.Rule // stale rules without a destination
	)
	for i := range rules {
		r := &rules[i]
		k, plain := ruleKeyOf(r)
		if plain && desired[k] {
			continue
		}
		if !inScope(k.From.Addr()) {
			continue
		}
		if !k.To.IsValid() {
			loose = append(loose, *r)
			continue
		}
		if err := o.nl.RuleDel(r); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("prune %s proto %d: %w", r, r.Protocol, err))
		}
	}
	// A delete without a destination removes the first rule of its
	// priority, source and table, which may be a desired rule with a
	// destination: delete, put back what went, and go on until the stale
	// rule itself is gone (the one put back goes after it).
	for i := range loose {
		errs = append(errs, o.pruneLoose(&loose[i], desired))
	}
	return errors.Join(errs...)
}

// pruneLoose deletes the stale rule r, which has no destination, re-adding
// the desired rules its deletes take instead.
func (o *ruleOps) pruneLoose(r *netlink.Rule, desired map[RuleKey]bool) error {
	stale, plain := ruleKeyOf(r)
	siblings := 0
	for k := range desired {
		if k.Priority == stale.Priority && k.From == stale.From && k.Table == stale.Table {
			siblings++
		}
	}
	// Each delete takes the first rule of the group; a sibling put back goes
	// after the stale rule, so siblings+1 deletes reach it.
	for range siblings + 2 {
		if err := o.nl.RuleDel(r); err != nil && !isGone(err) {
			return fmt.Errorf("prune %s proto %d: %w", r, r.Protocol, err)
		}
		if !plain {
			// A rule with another selector (a mark, an interface) is
			// matched by its delete exactly.
			return nil
		}
		rules, err := nldump.List("ip rule list", func() ([]netlink.Rule, error) { return o.nl.RuleList(r.Family) })
		if err != nil {
			return fmt.Errorf("ip rule list: %w", err)
		}
		present := map[RuleKey]bool{}
		for i := range rules {
			if k, plain := ruleKeyOf(&rules[i]); plain && int(rules[i].Protocol) == o.settings.PodRules.Protocol {
				present[k] = true
			}
		}
		for k := range desired {
			if k.Priority == stale.Priority && k.From == stale.From && k.Table == stale.Table && !present[k] {
				if err := o.nl.RuleAdd(netlinkRule(k, r.Family, o.settings.PodRules.Protocol)); err != nil && !errors.Is(err, unix.EEXIST) {
					return fmt.Errorf("re-add %q: %w", formatRule(k), err)
				}
			}
		}
		if !present[stale] {
			return nil
		}
	}
	return fmt.Errorf("prune %s: still in the kernel after %d deletes", formatRule(stale), siblings+2)
}
