// Package fqdn is the domain-name part of network policy: it enforces the
// egress entries whose peer is a domain name (endpoints.NameRule), which
// the AWS network policy controller writes for the domainNames of an
// ApplicationNetworkPolicy or a ClusterNetworkPolicy and which the AWS
// agent skips ("the eBPF dataplane is CIDR-based").
//
// A name means what the pod that asks is told. The DNS lookups of the pods
// a name rule selects, and only theirs, are redirected (TPROXY, UDP and TCP
// to port 53 of any resolver) to a transparent DNS proxy on the node
// (package proxy), which forwards each query to the resolver the pod asked
// and hands the answer to this package before the pod gets it. The names
// asked that a rule selecting the pod matches, with the addresses the
// answer leads to (through CNAMEs) and their TTL (at least --tofqdns-min-
// ttl), are written to policy-fqdn (endpoints.DNSName); the compiler
// allows them as it allows a cidr of the rule's object. The answer is held
// until the kernel holds its addresses (Applied: the pod's versions
// compiled from that revision of policy-fqdn and in force), so a pod that
// connects right after its lookup is never denied; past --tofqdns-proxy-
// response-max-delay it gets SERVFAIL instead. Addresses go when they
// expire (connections opened meanwhile live on in the connection table).
//
// Fail closed: a lookup the proxy cannot serve (down, overloaded, an
// answer that does not parse) fails, and nothing is allowed that was not;
// an address is never allowed for an answer the pod did not ask through
// the proxy (a forged reply sent to the pod teaches nothing). Memory is
// bounded: per pod and name --tofqdns-endpoint-max-ip-per-hostname
// addresses, per pod --tofqdns-max-names-per-pod names, the proxy's
// queries in flight; past them the first to expire go, counted.
//
// Files: cell.go (the jobs), config.go, answers.go (what an answer says),
// learn.go (the proxy's hook), expire.go, redirect.go (which pods are
// redirected), metrics.go.
package fqdn
