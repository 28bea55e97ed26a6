// Package manifests checks the deployment manifests under
// Documentation/deploy as an operator meets them: every kustomization
// renders (with kustomize's own API, as `kubectl kustomize` does), every
// rendered object passes the real kube-apiserver's validation in a
// server-side dry run, and the DaemonSet's parts (probes, capabilities,
// the CNI install) do what the documentation says.
//
// It is a module of its own because kustomize's API requires newer shared
// modules (golang.org/x/sys v0.48.0, gnostic-models v0.7.1) than the Cilium
// release the main module links into allows; `make test` runs it
// (`make test-manifests`).
package manifests
