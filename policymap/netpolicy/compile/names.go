package compile

import (
	"net/netip"
	"strings"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// Name rules (endpoints.NameRule): an egress entry whose peer is a domain
// name allows a pod the addresses the pod itself was told the name stands
// for (policy-fqdn, written by the fqdn part from the answers to the pod's
// lookups), as rules of one address each with the entry's ports and
// action. The semantics stay the kind's: the objects with name rules are
// compiled as copies whose name rules are those address rules
// (WithNameIPs), so a name's address is judged like any cidr of its
// object. A pod's addresses are its own, so its selection key holds them:
// pods of one policy that were told different addresses compile apart;
// pods of objects without name rules share templates as before.
//
// The deriver follows policy-fqdn too: a change of a pod's addresses
// recompiles the pod (a refreshed expiry alone does not), and each
// compile records the table's revision in the pod's versions of the tier
// (TierVersions.Names), which tells the fqdn part when an answer's
// addresses are in the kernel.

// named gives the name rules of a pod's selection their addresses. It
// returns the selection unchanged and revision 0 when none of its objects
// has name rules.
func (d *deriver[T, K]) named(txn statedb.ReadTxn, pod netip.Addr, sel selection[T], listing []T) (selection[T], statedb.Revision) {
	if d.names == nil || !hasNameRules(sel.objs) {
		return sel, 0
	}
	rev := d.names.Revision(txn)
	podName := ""
	for _, o := range listing {
		if e, ok := o.PodEntry(pod); ok {
			podName = e.Namespace + "/" + e.Name
			break
		}
	}
	rows := statedb.Collect(d.names.List(txn, endpoints.DNSNamePodIndex.Query(pod)))
	var key strings.Builder
	ips := func(r endpoints.NameRule) []netip.Addr {
		var out []netip.Addr
		for _, ip := range endpoints.IPsFor(rows, podName, r) {
			if bpf.FamilyOf(ip) == sel.family {
				out = append(out, ip)
				key.WriteString(ip.String())
				key.WriteByte(',')
			}
		}
		key.WriteByte(';')
		return out
	}
	objs := make([]T, len(sel.objs))
	for i, o := range sel.objs {
		objs[i] = o.WithNameIPs(ips)
	}
	sel.named, sel.objs = sel.objs, objs
	sel.objsKey += "|names:" + key.String()
	return sel, rev
}

func hasNameRules[T policyRow[T]](objs []T) bool {
	for _, o := range objs {
		if len(o.NameRules()) > 0 {
			return true
		}
	}
	return false
}

// namesChanged returns the pods whose addresses in policy-fqdn changed in
// a batch of its changes: a row that came, went or holds other addresses
// (seen keeps each row's last version; an expiry refreshed alone changes
// nothing compiled).
func namesChanged(batch func(func(statedb.Change[*endpoints.DNSName], statedb.Revision) bool), seen map[string]*endpoints.DNSName) []netip.Addr {
	pods := map[netip.Addr]struct{}{}
	for c := range batch {
		key := c.Object.Key()
		old, ok := seen[key]
		switch {
		case c.Deleted:
			delete(seen, key)
		case ok && old.SameIPs(c.Object):
			seen[key] = c.Object
			continue
		default:
			seen[key] = c.Object
		}
		pods[c.Object.Pod] = struct{}{}
	}
	return sortedAddrs(pods)
}

// mergeAddrs is the union of two sorted lists of addresses, sorted.
func mergeAddrs(a, b []netip.Addr) []netip.Addr {
	if len(b) == 0 {
		return a
	}
	set := make(map[netip.Addr]struct{}, len(a)+len(b))
	for _, p := range a {
		set[p] = struct{}{}
	}
	for _, p := range b {
		set[p] = struct{}{}
	}
	return sortedAddrs(set)
}
