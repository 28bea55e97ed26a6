// Package agentapi is both sides of the agent's HTTP API on its unix
// socket, written once: the error body every endpoint answers with, the
// helpers a handler writes its answers with (JSON, an error with its
// status, a stream of JSON lines), the strict decoding of every request
// body (through strictdecode, bounded in size), the parsing of the query
// parameters the endpoints share (a boolean, a bounded wait, addresses),
// and the one client (the plain call and the streaming one) that
// enimasq-cni, enimasq-dbg and the tests talk to the agent with.
//
// The agent's features (ipam/allocator, policymap/netpolicy/enforce) and
// the API server of cells/infra answer through it, so that the wire is the
// same everywhere: the error body is {"error", "reason"} (plus what an
// endpoint adds to it, as IPAM's result), a request body is refused with a
// 400 that names the field at fault, and a client reads every error answer
// the same way. No other package writes an HTTP body or decodes one
// (layout_test.go holds it), as Cilium keeps its API's models and client
// in api/v1 and its server helpers in pkg/api.
//
// It imports no feature: the wire types of an endpoint stay with the
// feature that serves it (ipam/ipamapi, enforce's DeviceAnswer).
package agentapi
