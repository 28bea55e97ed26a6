// Package kernel keeps the kernel's network state as statedb tables:
// kernel-links, kernel-addrs, kernel-routes (every table) and kernel-rules,
// both families, in the agent's network namespace. Every feature that
// follows the kernel derives from them, as Cilium's features derive from
// pkg/datapath/tables (devices, routes, node-addresses):
//
//   - cells/nodeips: the netlink rows of node-ips, from kernel-addrs (and
//     kernel-links for the devices' names);
//   - policymap/netpolicy/enforce: the pod devices to enforce on, from
//     kernel-routes and kernel-links;
//   - ipam/datapath: the repair of rules and routes deleted or replaced
//     behind enimasq's back, from kernel-rules, kernel-routes and
//     kernel-links.
//
// Why one cell: each of those used to subscribe on its own (three sockets,
// each woken by every change) and to list the kernel on every
// notification. Here there is one netlink subscription (one socket, all
// the groups) and, after each batch of notifications, one listing of the
// kinds they made stale, through cells/nldump (a dump a change interrupts
// is run again, never taken half). The rows are listed, not decoded from
// the notifications: vishvananda/netlink exports no decoder of route, rule
// or address messages, and a listing also covers what the kernel does not
// announce (the IPv4 routes a deleted or downed link takes with it: a link
// change lists the routes and addresses again). A socket that overflows
// (ENOBUFS: notifications lost) or fails makes every kind stale; a failed
// socket is opened again. Only this cell writes the tables; a table is
// initialized after the first complete listing, so a reader never prunes
// from an empty table.
//
// The kernel is read through a Source: the process's network namespace
// (NewNetlink), another one when a *netns.NsHandle is provided, or any
// Source provided to the hive. Tests without root provide a fake
// (ipam/netlinkfake implements Source), so the derivations run unchanged
// on either.
//
// Writers are not readers: the ipam/datapath and enforce reconcilers still
// list what they are about to change (an EEXIST checked against the exact
// rule, a prune of our own protocol, tc filters), with their own handles,
// through nldump; layout_test.go holds that no other package subscribes or
// dumps.
package kernel
