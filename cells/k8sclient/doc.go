// Package k8sclient is the agent's optional connection to the Kubernetes API
// server: the --k8s-kubeconfig-path and --k8s-node-name flags, and a *Client
// that the API-backed sources (CiliumNode, PolicyEndpoints) use.
//
// The client is enabled with a kubeconfig, or in a pod (KUBERNETES_SERVICE_HOST
// set) with the in-cluster config; otherwise it is disabled and the agent
// reads files only. It never fails the agent's start because the API server
// is unreachable: its health is Degraded with the reason and it retries with
// backoff, while the sources keep the kernel state as it is.
package k8sclient
