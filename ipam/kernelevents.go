package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ruleRepair puts a rule of ours back as soon as someone else deletes it,
// instead of at the next refresh: it listens to the kernel's rule
// notifications in the agent's network namespace and, after a deletion,
// marks Pending every Done row of eni-rules whose rule the kernel no longer
// holds exactly; the reconciler adds it again. A row says Done only while
// the kernel holds its rule. The periodic refresh stays as the safety net
// (for a lost notification).
//
// With Cilium's IPAM, only the rules of pods Cilium still routes (their
// ingress rule is there) are repaired: cilium-cni's DEL removes a pod's
// rules before the CiliumNode's status drops the pod, and they must not
// come back meanwhile.
type ruleRepair struct {
	log      *slog.Logger
	db       *statedb.DB
	rules    statedb.RWTable[*Rule]
	nl       *nlHandle
	settings Settings
	ns       *netns.NsHandle // nil: the process's namespace
}

// run subscribes to rule notifications until ctx ends.
func (r *ruleRepair) run(ctx context.Context, health cell.Health) error {
	groups := []uint{}
	for _, fam := range r.nl.families {
		if fam == unix.AF_INET {
			groups = append(groups, unix.RTNLGRP_IPV4_RULE)
		} else {
			groups = append(groups, unix.RTNLGRP_IPV6_RULE)
		}
	}
	var (
		sock *nl.NetlinkSocket
		err  error
	)
	if r.ns != nil {
		sock, err = nl.SubscribeAt(*r.ns, netns.None(), unix.NETLINK_ROUTE, groups...)
	} else {
		sock, err = nl.Subscribe(unix.NETLINK_ROUTE, groups...)
	}
	if err != nil {
		// Not fatal: the refresh repairs, later.
		health.Degraded("no rule notifications: deleted rules come back at the refresh only", err)
		<-ctx.Done()
		return nil
	}
	// A receive timeout lets the reader see the end of ctx.
	if err := sock.SetReceiveTimeout(&unix.Timeval{Usec: 100_000}); err != nil {
		sock.Close()
		return fmt.Errorf("rule notifications: %w", err)
	}

	deleted := make(chan struct{}, 1)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for ctx.Err() == nil {
			msgs, _, err := sock.Receive()
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, unix.EINTR) {
					continue
				}
				if errors.Is(err, unix.ENOBUFS) {
					// Notifications were lost: check everything.
					notify(deleted)
					continue
				}
				r.log.Warn("Rule notifications stopped; deleted rules come back at the refresh", "error", err)
				return
			}
			for _, m := range msgs {
				if m.Header.Type == unix.RTM_DELRULE {
					notify(deleted)
				}
			}
		}
	}()
	defer func() {
		<-readerDone
		sock.Close()
	}()

	health.OK("Watching rule deletions")
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deleted:
			if n, err := r.repair(); err != nil {
				health.Degraded("checking the rules after a deletion", err)
			} else {
				if n > 0 {
					r.log.Info("Rules deleted by someone else: putting them back", "rules", n)
				}
				health.OK("Watching rule deletions")
			}
		}
	}
}

// notify signals ch without blocking: one pending signal covers a burst.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// repair marks Pending the Done rows whose rule the kernel does not hold, and
// returns how many.
func (r *ruleRepair) repair() (int, error) {
	present := map[RuleKey]bool{}
	routed := map[netip.Addr]bool{} // pods with an ingress rule
	for _, fam := range r.nl.families {
		rules, err := listAll(func() ([]netlink.Rule, error) { return r.nl.RuleList(fam) })
		if err != nil {
			return 0, fmt.Errorf("ip rule list: %w", err)
		}
		for i := range rules {
			k, plain := ruleKeyOf(&rules[i])
			if plain && int(rules[i].Protocol) == r.settings.PodRules.Protocol {
				present[k] = true
			}
			if k.Priority == r.settings.PodRules.IngressPriority && k.To.IsValid() && k.To.IsSingleIP() && !k.From.IsValid() {
				routed[k.To.Addr()] = true
			}
		}
	}
	wtxn := r.db.WriteTxn(r.rules)
	defer wtxn.Abort()
	var missing []*Rule
	for row := range r.rules.All(wtxn) {
		if row.Status.Kind != reconciler.StatusKindDone || present[row.RuleKey] {
			continue
		}
		if !r.settings.OwnsAllocations() && !routed[row.Pod] {
			continue
		}
		missing = append(missing, row)
	}
	for _, row := range missing {
		r.rules.Insert(wtxn, row.Clone().SetStatus(reconciler.StatusPending()))
	}
	wtxn.Commit()
	return len(missing), nil
}
