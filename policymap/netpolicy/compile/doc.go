// Package compile is the compiler part of network policy: from
// policy-endpoints (package endpoints) it derives the policy-map-entries
// table, one row per entry of a policy map, and reconciles that into the
// maps enimasq_egress_v4/_v6 and enimasq_ingress_v4/_v6 (cell.go), which
// the verdict program reads; from cluster-policy-endpoints, the same way,
// cluster-policy-map-entries and the cluster maps (cluster.go).
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
// writes only the entries whose bytes differ; large selections compile in
// the background, so a small change is not held behind them. The rows
// (table.go) share their template's entries: 80 bytes a row. A pod's rows
// change in one step (versions.go, switch.go), and a change costs what
// changed: where no state on the way is more open than both ends, the
// version in force is edited in place (edit.go), the edit computed once per
// selection from its templates (delta.go); changes are worked oldest first
// (queue.go); a restart takes over what the kernel holds (adopt.go).
//
// Everything but the semantics is written once for both kinds of policy
// object: a kind is a descriptor (kinds.go), a type without fields whose
// methods name its objects' indexes, its table, maps and tier and its
// compile function. A third kind costs one descriptor,
//
//	type fooKind struct{}
//
//	func (fooKind) tableName() string                        { return "foo-policy-map-entries" }
//	func (fooKind) compile(sel selection[*endpoints.Foo]) []*policyTemplate { ... }
//	// ... the other methods of kind[*endpoints.Foo]
//
// its tier in policy-versions (versions_table.go), and one line in Cell:
// registerMaps[*endpoints.Foo, fooKind]. Its rows are MapEntry[fooKind].
package compile
