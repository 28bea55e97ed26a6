package k8sclient

import (
	"github.com/spf13/pflag"
)

// Config holds the Kubernetes client flags.
type Config struct {
	K8sKubeconfigPath string `mapstructure:"k8s-kubeconfig-path"`
	K8sNodeName       string `mapstructure:"k8s-node-name"`
}

// DefaultConfig leaves both flags empty: the defaults are resolved at start
// (in-cluster config, $K8S_NODE_NAME or the hostname), so that the flag
// reference does not print the build machine's hostname.
var DefaultConfig = Config{}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("k8s-kubeconfig-path", def.K8sKubeconfigPath,
		"Kubeconfig for the Kubernetes API server; empty: the in-cluster config when KUBERNETES_SERVICE_HOST is set, else no Kubernetes API sources")
	flags.String("k8s-node-name", def.K8sNodeName,
		"This node's name in Kubernetes (default $K8S_NODE_NAME, else the hostname)")
}

// NodeNameEnv is the environment variable that names the node when
// --k8s-node-name is not given (a DaemonSet sets it from spec.nodeName).
const NodeNameEnv = "K8S_NODE_NAME"
