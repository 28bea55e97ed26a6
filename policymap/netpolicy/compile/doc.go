// Package compile is the compiler part of network policy: from
// policy-endpoints (package endpoints) it derives the policy-map-entries
// table, one row per entry of a policy map, and reconciles that into the
// maps enimasq_egress_v4/_v6 and enimasq_ingress_v4/_v6 (cell.go), which
// the verdict program reads.
//
// CompilePod (compile.go) is the semantics and the encoding: pure and
// deterministic. A pod IP's selection (template.go: the objects that select
// it and its node IPs) is compiled once per direction in one sweep over the
// boundary prefixes (sweep.go), the ports allowed at each boundary counted
// per port in a segment tree (portcover.go) and their values interned
// (values.go), into templates that every pod of the selection stamps with
// its IP. A selection holds the objects that list the pod and the other
// slices of their policies (endpoints.Union, taken once per transaction in
// slices.go). The deriver (derive.go) recompiles only the pod IPs a change
// lists, with those of every slice of a changed object's policy, and
// writes only the entries whose bytes differ; large selections compile in the background, so a
// small change is not held behind them. The rows (table.go) share their
// template's entries: 80 bytes a row.
package compile
