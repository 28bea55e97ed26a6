// Package source is the source part of network policy: it reads the
// PolicyEndpoint objects (networking.k8s.aws/v1alpha1) of a directory
// (source.go), or of the API server in all namespaces, keeping the pods of
// this node (source_k8s.go, the node rule), into the policy-endpoints table
// (package endpoints), which it alone writes.
//
// Decoding and validation (parse.go, types.go, through cells/strictdecode,
// which also splits a file into documents) name the file, document, object, field and value of
// an error. An object that is not valid never opens a pod (recover.go): its
// last good version stays, and with none a stand-in isolates the pods it
// names in the directions it names; the source is Degraded until it is
// valid. The decoder uses the row types by their short names (rows.go:
// aliases of package endpoints' types).
package source
