package k8sclient_test

import (
	"bytes"
	"context"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"golang.org/x/tools/txtar"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/test/k8stest"
)

func TestNodeNameAndSource(t *testing.T) {
	kubeconfig := k8stest.UnreachableKubeconfig(t)

	for _, tc := range []struct {
		name     string
		cfg      k8sclient.Config
		env      map[string]string
		hostname string
		node     string
		enabled  bool
		source   string
		err      string
	}{
		{name: "flag wins", cfg: k8sclient.Config{K8sNodeName: "from-flag"}, env: map[string]string{"K8S_NODE_NAME": "from-env"}, hostname: "host", node: "from-flag"},
		{name: "env", env: map[string]string{"K8S_NODE_NAME": "ip-10-0-0-1.ec2.internal"}, hostname: "host", node: "ip-10-0-0-1.ec2.internal"},
		{name: "empty env", env: map[string]string{"K8S_NODE_NAME": ""}, hostname: "host", node: "host"},
		{name: "hostname lower-cased as the kubelet does", hostname: " Node-A.Example \n", node: "node-a.example"},
		{name: "invalid flag", cfg: k8sclient.Config{K8sNodeName: "Bad_Name"}, hostname: "host",
			err: `node name "Bad_Name" from --k8s-node-name is not a valid Kubernetes node name`},
		{name: "invalid hostname", hostname: "under_score", err: `node name "under_score" from the hostname (set --k8s-node-name or $K8S_NODE_NAME)`},
		{name: "kubeconfig", cfg: k8sclient.Config{K8sKubeconfigPath: kubeconfig}, hostname: "h", node: "h", enabled: true, source: "kubeconfig " + kubeconfig},
		{name: "kubeconfig wins over in-cluster", cfg: k8sclient.Config{K8sKubeconfigPath: kubeconfig},
			env: map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, hostname: "h", node: "h", enabled: true, source: "kubeconfig " + kubeconfig},
		{name: "missing kubeconfig", cfg: k8sclient.Config{K8sKubeconfigPath: "/nonexistent/kubeconfig"}, hostname: "h",
			err: "--k8s-kubeconfig-path /nonexistent/kubeconfig: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := k8sclient.NewClientEnv(tc.cfg, tc.env, tc.hostname)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.NodeName() != tc.node || c.IsEnabled() != tc.enabled || c.Source() != tc.source {
				t.Fatalf("node %q enabled %t source %q, want %q %t %q", c.NodeName(), c.IsEnabled(), c.Source(), tc.node, tc.enabled, tc.source)
			}
			if !tc.enabled && (c.Dynamic() != nil || c.RESTConfig() != nil || c.Host() != "") {
				t.Fatal("a disabled client has a dynamic client, a config or a host")
			}
			if tc.enabled && (c.Dynamic() == nil || c.Host() != "https://127.0.0.1:1") {
				t.Fatalf("enabled client: dynamic %v host %q", c.Dynamic(), c.Host())
			}
		})
	}
}

func TestInClusterWithoutToken(t *testing.T) {
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		t.Skip("runs in a pod: the in-cluster config is usable here")
	}
	_, err := k8sclient.NewClientEnv(k8sclient.Config{},
		map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, "h")
	if err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST is set but the in-cluster config is unusable") {
		t.Fatalf("error %v", err)
	}
}

// TestDisabled: without a kubeconfig and outside a pod, the client is
// disabled, healthy, and the hive runs.
func TestDisabled(t *testing.T) {
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		t.Skip("runs in a pod: the client would be enabled")
	}
	runScript(t, "disabled", nil, `
hive start
health 'k8s-client.*level=OK message=Disabled: no --k8s-kubeconfig-path and not in a pod \(node node-2\)'
`, "--k8s-node-name=node-2")
}

// TestScripts runs testdata/*.txtar, each against its own API server;
// $KUBECONFIG is its admin kubeconfig, and the k8s/... commands of k8stest
// act on it.
func TestScripts(t *testing.T) {
	k8stest.Scripts(t, "testdata/*.txtar", func(t *testing.T, c *k8stest.Cluster, file string, archive *txtar.Archive, args []string) {
		runScript(t, file, c, string(archive.Comment), args...)
	})
}

func runScript(t *testing.T, file string, c *k8stest.Cluster, text string, args ...string) {
	restore := k8sclient.SetProbeIntervals(200*time.Millisecond, 100*time.Millisecond, 400*time.Millisecond)
	t.Cleanup(restore) // after the hive stopped: cleanups run last-in first-out
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)

	work := t.TempDir()
	env := []string{"WORK=" + work}
	if c != nil {
		env = append(env, "KUBECONFIG="+c.Kubeconfig)
	}
	s, err := script.NewState(ctx, work, env)
	if err != nil {
		t.Fatal(err)
	}
	if archive, err := txtar.ParseFile(file); err == nil {
		if err := s.ExtractFiles(archive); err != nil {
			t.Fatal(err)
		}
	}
	e := celltest.NewEngine(t, args, k8sclient.Cell)
	if c != nil {
		maps.Copy(e.Cmds, c.ScriptCommands())
	}
	scripttest.Run(t, e, s, file, bytes.NewReader([]byte(text)))
}

// TestServiceAccount runs the client as the DaemonSet does, with the
// service account and ClusterRole of Documentation/deploy/standalone: an informer on
// this node's CiliumNode sees that object only, the status can be written,
// the spec cannot.
func TestServiceAccount(t *testing.T) {
	c := k8stest.Start(t)
	c.ApplyFile(t, "../../Documentation/deploy/standalone/rbac.yaml")
	sample := k8stest.DecodeFile(t, "../../test/testdata/samples/ciliumnode.yaml")[0]
	other := sample.DeepCopy()
	other.SetName("some-other-node")
	c.MustApply(t, sample, other)

	client, err := k8sclient.NewClient(k8sclient.Config{
		K8sKubeconfigPath: c.ServiceAccountKubeconfig(t, "kube-system", "enimasq"),
		K8sNodeName:       sample.GetName(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if v, err := client.ServerVersion(ctx); err != nil || v.GitVersion != k8stest.KubernetesVersion {
		t.Fatalf("ServerVersion: %v %v", v, err)
	}

	lw := client.ListerWatcher(k8sclient.CiliumNodes, "", func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", client.NodeName()).String()
	})
	inf := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	if keys := inf.GetStore().ListKeys(); len(keys) != 1 || keys[0] != sample.GetName() {
		t.Fatalf("informer has %v, want only %s", keys, sample.GetName())
	}

	// The agent's write: status.ipam.used, through the status subresource.
	nodes := client.Dynamic().Resource(k8sclient.CiliumNodes)
	obj, err := nodes.Get(ctx, client.NodeName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]any{"10.130.100.133": map[string]any{"owner": "shop/web-7d9f8c6b5-abcde", "resource": "eni-0a1b2c3d4e5f00001"}}
	if err := unstructured.SetNestedMap(obj.Object, used, "status", "ipam", "used"); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status: %s", err)
	}
	// The informer sees the agent's own write.
	deadline := time.Now().Add(30 * time.Second)
	for {
		o, ok, _ := inf.GetStore().GetByKey(client.NodeName())
		if ok {
			if got, _, _ := unstructured.NestedMap(o.(*unstructured.Unstructured).Object, "status", "ipam", "used"); len(got) == 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("informer did not see status.ipam.used")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The spec is the operator's: forbidden.
	if _, err := nodes.Update(ctx, obj, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("update spec: %v, want forbidden", err)
	}
	// PolicyEndpoints in all namespaces: allowed.
	if _, err := client.Dynamic().Resource(k8sclient.PolicyEndpoints).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("list policyendpoints: %s", err)
	}
}
