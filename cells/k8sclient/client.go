package k8sclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// The resources the API-backed sources read, as the ClusterRole in
// Documentation/deploy grants them.
var (
	// CiliumNodes are cluster-scoped; the agent reads the one named after
	// its node and writes its status (status.ipam.used).
	CiliumNodes = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnodes"}
	// PolicyEndpoints are namespaced; the agent reads them in all namespaces.
	PolicyEndpoints = schema.GroupVersionResource{Group: "networking.k8s.aws", Version: "v1alpha1", Resource: "policyendpoints"}
)

// Client is the agent's connection to the Kubernetes API server. It is
// always provided; IsEnabled tells whether the agent has an API server at
// all (a kubeconfig or the in-cluster config). A disabled client still knows
// the node name.
type Client struct {
	nodeName string
	source   string // "kubeconfig <path>", "in-cluster config", or the embedding agent's
	config   *rest.Config
	dynamic  dynamic.Interface
	disc     discovery.DiscoveryInterface

	// embedded, when set, lists and watches through the connection of the
	// agent enimasq is linked into (NewEmbedded).
	embedded ListerWatcherFunc
	host     string
}

// ListerWatcherFunc lists and watches resource gvr in namespace, with tweak
// applied to every list and watch (see Client.ListerWatcher). The objects
// are *unstructured.Unstructured. It returns nil for a resource it leaves to
// the dynamic client.
type ListerWatcherFunc func(gvr schema.GroupVersionResource, namespace string, tweak func(*metav1.ListOptions)) cache.ListerWatcher

// NewEmbedded is the Client of an agent that enimasq is linked into and that
// has its own connection to the API server (Cilium's clientset): the
// API-backed sources list and watch through lw, or through dyn (a dynamic
// client on that connection) for the resources lw leaves, and no second
// flag or probe is made. host and source only describe it in logs and
// health. The node name is validated as NewClient does. A nil lw is a
// disabled client.
func NewEmbedded(nodeName, source, host string, dyn dynamic.Interface, lw ListerWatcherFunc) (*Client, error) {
	if errs := validation.IsDNS1123Subdomain(nodeName); len(errs) > 0 {
		return nil, fmt.Errorf("node name %q is not a valid Kubernetes node name: %s", nodeName, strings.Join(errs, "; "))
	}
	if lw == nil {
		return &Client{nodeName: nodeName}, nil
	}
	return &Client{nodeName: nodeName, source: source, host: host, dynamic: dyn, embedded: lw}, nil
}

// NewClient resolves the flags into a Client. It does not contact the API
// server: an unreadable kubeconfig, or a pod without its service account
// token, is an error; an API server that does not answer is not.
func NewClient(cfg Config) (*Client, error) {
	return newClient(cfg, os.LookupEnv, os.Hostname)
}

func newClient(cfg Config, lookupEnv func(string) (string, bool), hostname func() (string, error)) (*Client, error) {
	node, err := nodeName(cfg, lookupEnv, hostname)
	if err != nil {
		return nil, err
	}
	c := &Client{nodeName: node}

	var rc *rest.Config
	switch host, inCluster := lookupEnv("KUBERNETES_SERVICE_HOST"); {
	case cfg.K8sKubeconfigPath != "":
		c.source = "kubeconfig " + cfg.K8sKubeconfigPath
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.K8sKubeconfigPath)
		if err != nil {
			return nil, fmt.Errorf("--k8s-kubeconfig-path %s: %w", cfg.K8sKubeconfigPath, err)
		}
	case inCluster && host != "":
		c.source = "in-cluster config"
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("KUBERNETES_SERVICE_HOST is set but the in-cluster config is unusable (set --k8s-kubeconfig-path outside a pod): %w", err)
		}
	default:
		return c, nil
	}
	if rc.UserAgent == "" {
		rc.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	c.config = rc
	if c.dynamic, err = dynamic.NewForConfig(rc); err != nil {
		return nil, fmt.Errorf("%s: %w", c.source, err)
	}
	if c.disc, err = discovery.NewDiscoveryClientForConfig(rc); err != nil {
		return nil, fmt.Errorf("%s: %w", c.source, err)
	}
	return c, nil
}

// nodeName is --k8s-node-name, else $K8S_NODE_NAME, else the hostname in
// lower case (as the kubelet registers it). It must be a valid object name:
// the CiliumNode is named after it.
func nodeName(cfg Config, lookupEnv func(string) (string, bool), hostname func() (string, error)) (string, error) {
	name, from := cfg.K8sNodeName, "--k8s-node-name"
	if name == "" {
		if env, ok := lookupEnv(NodeNameEnv); ok && env != "" {
			name, from = env, "$"+NodeNameEnv
		}
	}
	if name == "" {
		h, err := hostname()
		if err != nil {
			return "", fmt.Errorf("no --k8s-node-name, no $%s, and no hostname: %w", NodeNameEnv, err)
		}
		name, from = strings.ToLower(strings.TrimSpace(h)), "the hostname (set --k8s-node-name or $"+NodeNameEnv+")"
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("node name %q from %s is not a valid Kubernetes node name: %s", name, from, strings.Join(errs, "; "))
	}
	return name, nil
}

// IsEnabled tells whether there is an API server: a kubeconfig was given, or
// the agent runs in a pod.
func (c *Client) IsEnabled() bool { return c.config != nil || c.embedded != nil }

// NodeName is this node's name in Kubernetes, also when the client is
// disabled.
func (c *Client) NodeName() string { return c.nodeName }

// Source says where the configuration came from: "kubeconfig <path>",
// "in-cluster config", or "" when disabled.
func (c *Client) Source() string { return c.source }

// Host is the API server's URL, or "" when disabled.
func (c *Client) Host() string {
	if c.embedded != nil {
		return c.host
	}
	if c.config == nil {
		return ""
	}
	return c.config.Host
}

// RESTConfig returns a copy of the client configuration (for a typed or
// REST client of the caller's own), or nil when disabled.
func (c *Client) RESTConfig() *rest.Config {
	if c.config == nil {
		return nil
	}
	return rest.CopyConfig(c.config)
}

// Dynamic is the dynamic client, or nil when disabled.
func (c *Client) Dynamic() dynamic.Interface { return c.dynamic }

// ListerWatcher lists and watches resource gvr in namespace (all namespaces
// or a cluster-scoped resource: ""), for a client-go informer or reflector.
// tweak, if not nil, edits the options of every list and watch, e.g. to set
// a field selector on metadata.name. The objects are
// *unstructured.Unstructured. It panics when the client is disabled.
func (c *Client) ListerWatcher(gvr schema.GroupVersionResource, namespace string, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	if c.embedded != nil {
		if lw := c.embedded(gvr, namespace, tweak); lw != nil {
			return lw
		}
	}
	if c.dynamic == nil {
		panic("k8sclient: ListerWatcher on a disabled client")
	}
	ri := c.dynamic.Resource(gvr).Namespace(namespace)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			if tweak != nil {
				tweak(&opts)
			}
			return ri.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if tweak != nil {
				tweak(&opts)
			}
			return ri.Watch(ctx, opts)
		},
	}
}

// errDisabled is returned by ServerVersion on a disabled client.
var errDisabled = errors.New("no Kubernetes API server configured")

// ServerVersion asks the API server for its version: a round trip that
// needs the server to answer and the credentials to be accepted.
func (c *Client) ServerVersion(ctx context.Context) (*version.Info, error) {
	if c.disc == nil {
		return nil, errDisabled
	}
	body, err := c.disc.RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	var info version.Info
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("/version: %w", err)
	}
	return &info, nil
}
