// Package endpoints is the policy-endpoints table: one row per
// PolicyEndpoint object in force on this node (networking.k8s.aws/v1alpha1,
// as the AWS network policy controller writes them), validated, with the
// pods it selects by IP and its rules; or, for an object that is not valid,
// its last good version or its stand-in, which fails closed. It has one
// writer, the source (package source, from files or the API server), and
// two readers: the compiler (package compile, into policy-map-entries) and
// enforcement (package enforce, through the pod IPs it selects).
package endpoints
