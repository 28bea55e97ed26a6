// Package dnsproxy is the DNS proxy of FQDN egress policy. A `domainName`
// entry allows the addresses a name resolves to, and only the answers the
// pod itself gets can say which those are: so the DNS of the pods such an
// entry selects passes through this proxy, which puts the answered
// addresses into the kernel's policy (through a Hook) before the pod can
// use them. A pod that connected before its policy held the address would
// be denied: the hook runs first, the answer goes to the pod after.
//
// The proxy is transparent. Redirect steers the pods' UDP and TCP to port 53
// (to any resolver) with TPROXY to the proxy's sockets in the node's
// network namespace; the proxy learns where the pod was going (the
// original destination), asks that very resolver from a socket of the node,
// and answers from the resolver's address and port, so the pod's stub
// resolver (a connected socket) sees an ordinary reply. Pods that no
// entry selects are not redirected and their DNS is not touched.
//
// It fails closed. A query it cannot serve (over MaxInFlight, upstream
// timeout, an answer that does not parse or does not answer the question,
// a hook error) gets SERVFAIL; a request that is not DNS is dropped; with
// the proxy stopped the TPROXY rules find no socket and the kernel drops
// the pod's DNS. The hook sees every answer before the pod does (of a
// truncated UDP answer, the records that parse: the pod asks again over
// TCP, and an address the hook did not see is not in the policy anyway).
// Only what was sent to port 53 is served: a query sent to the proxy's own
// port is dropped (forwarded, it would come back to the proxy).
//
// Files: config.go (settings, limits and their reasons), proxy.go (the
// Proxy, Run), stats.go (counters), sockets.go (transparent sockets),
// origdst.go (the original destination of a redirected datagram),
// udp.go and tcp.go (the two transports), upstream.go (asking the
// resolver and checking its answer), netns.go (the namespace the sockets
// to resolvers are opened in), reply.go (UDP answers from the resolver's
// address through a raw socket), redirect.go and redirect_rules.go (the
// TPROXY rules and the policy routing). The privileged tests build a node,
// two pods and a resolver in network namespaces (topology_test.go).
package dnsproxy
