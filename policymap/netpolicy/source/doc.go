// Package source is the source part of network policy: it reads the
// PolicyEndpoint and ClusterPolicyEndpoint objects
// (networking.k8s.aws/v1alpha1) of a directory, the kind of each document
// deciding its table (source.go, files.go, table.go), or of the API
// server, keeping the pods of this node (source_k8s.go, the node rule),
// into the policy-endpoints and cluster-policy-endpoints tables (package
// endpoints), which it alone writes.
//
// Decoding and validation (parse.go, validate.go, types.go, through
// cells/strictdecode, which also splits a file into documents) name the
// file, document, object, field and value of an error. An object that is
// not valid never opens a pod (recover.go): its last good version stays,
// and with none a stand-in takes its place (a PolicyEndpoint's isolates
// the pods it names in the directions it names, a ClusterPolicyEndpoint's
// denies them everything but their node at the top of the Admin tier); the
// source is Degraded until it is valid. The decoder uses the row types by
// their short names (rows.go: aliases of package endpoints' types).
//
// # One descriptor per kind
//
// The file parser, the directory source, the API source, the fail-closed
// recovery and the table plumbing are written once for every kind
// (kind.go: kind, and its erased forms anyKind and kindTable). A kind is
// one descriptor, in its own file (kind_pe.go, kind_cpe.go), holding only
// what its objects mean: its names and API resource, how one is decoded
// and validated (its wire shape in types.go and a validator that embeds
// validator), what its stand-in reads leniently and what it denies, and
// what of a row a node does not program. A third kind, say Foo, costs
// its row type and table in package endpoints (a type with the methods of
// endpoints.Row, and newKind[*Foo]("foos")); its name in kinds, and its
// table and metrics in the cell (params, register and metrics.go, in the
// order of kinds); and kind_foo.go: its wire shape, its validator, and
//
//	var foos = &kind[Foo, *Foo]{
//		name: "Foo", list: "FooList", named: regexp.MustCompile(`\bFoo\b`),
//		resource: fooResource, namespaced: true, scope: "foos",
//		fate: "denied everything", table: endpoints.Foos,
//		decode: func(file string, base *field.Path, js []byte) (*Foo, error) {
//			return decodeWith(base, js, &fooValidator{foo: &Foo{File: file}})
//		},
//		lenient:    lenientFoo, // its key and policyRef, read leniently
//		failClosed: func(f *Foo) string { f.Rules = nil; return "denied everything" },
//		forNode:    func(f *Foo, node nodeconfig.Config) *Foo { return f },
//	}
//
// Everything else (documents and lists of it, duplicates, stand-ins and
// last good versions, files that hold it with other kinds, the API watch
// and the node rule, health, logs and metrics) it gets from the code
// written once.
package source
