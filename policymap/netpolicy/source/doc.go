// Package source is the source part of network policy: it reads the
// PolicyEndpoint and ClusterPolicyEndpoint objects
// (networking.k8s.aws/v1alpha1) of a directory, the kind of each document
// deciding its table (source.go), or of the API server, keeping the pods of
// this node (source_k8s.go, source_k8s_cluster.go, the node rule), into
// the policy-endpoints and cluster-policy-endpoints tables (package
// endpoints), which it alone writes.
//
// Decoding and validation (parse.go, parse_cluster.go, types.go, through
// cells/strictdecode, which also splits a file into documents) name the
// file, document, object, field and value of an error. An object that is
// not valid never opens a pod (recover.go, recover_cluster.go): its last
// good version stays, and with none a stand-in takes its place (a
// PolicyEndpoint's isolates the pods it names in the directions it names, a
// ClusterPolicyEndpoint's denies them everything but their node at the top
// of the Admin tier); the source is Degraded until it is valid. The decoder
// uses the row types by their short names (rows.go: aliases of package
// endpoints' types).
package source
