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
package endpoints
