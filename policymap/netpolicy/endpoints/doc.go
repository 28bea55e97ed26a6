// Package endpoints is the policy-endpoints and cluster-policy-endpoints
// tables: one row per PolicyEndpoint or ClusterPolicyEndpoint object in
// force on this node (networking.k8s.aws/v1alpha1, as the AWS network
// policy controller writes them), validated, with the pods it selects by
// IP and its rules; or, for an object that is not valid, its last good
// version or its stand-in, which fails closed. A policy is the union of its
// slices (slices.go): the controller cuts one policy into several objects,
// and a pod that one of them lists gets the rules of all. The tables have
// one writer, the source (package source, from files or the API server),
// and two readers: the compiler (package compile, into the map entries)
// and enforcement (package enforce, through the pod IPs they select).
//
// The tables are written once for every kind (kind.go: Kind, its indexes
// and cell; Row, what code written once for every kind needs of a row);
// each kind is its row type and its Kind (kind_pe.go, kind_cpe.go). A
// third kind costs one such file: its row type, with the methods of Row
// (Key and Parent say what it is, Common points at the fields every row
// has), its Kind (newKind with its table name), and a line in Cell.
package endpoints
