package k8stest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Pods as a kubelet reports them. No kubelet runs here: a pod is created
// on its node (spec.nodeName) and its status (phase Running, its IPs, its
// node's IPs, Ready) is written through the status subresource, as the
// kubelet of that node would once the CNI plugin gave it its addresses.
// That is what the AWS network policy controller reads of a pod (its
// status.podIP, status.hostIP, labels and container ports), so a pod made
// here is a pod to it.

var pods = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// PodImage is the image of a pod's one container: nothing pulls it.
const PodImage = "registry.invalid/pod:test"

// RunningPod creates the pod namespace/name on node with labels and one
// container (named "app") that has ports (named ports are what a policy's
// port names resolve to), and writes its status as the node's kubelet
// would for a running, ready pod: podIP and hostIP, each one address or
// one per family separated by a comma ("10.0.1.5,fd00::1:5"; the first is
// status.podIP or status.hostIP, all are status.podIPs or
// status.hostIPs, as a dual-stack kubelet writes them). The namespace and
// its default ServiceAccount (which pod admission requires, and which no
// controller-manager creates here) are created when missing. Called again
// for a pod that exists, it applies the same way: its labels and status
// may change, its ports not (a pod's spec is immutable). It returns the
// pod as the API server has it.
func (c *Cluster) RunningPod(t testing.TB, ns, name, node, podIP, hostIP string, labels map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod, err := c.runningPod(ctx, ns, name, node, podIP, hostIP, labels, ports)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func (c *Cluster) runningPod(ctx context.Context, ns, name, node, podIP, hostIP string, labels map[string]string, ports []corev1.ContainerPort) (*corev1.Pod, error) {
	what := "pod " + ns + "/" + name
	podIPs, err := addressList(podIP)
	if err != nil {
		return nil, fmt.Errorf("%s: podIP: %w", what, err)
	}
	hostIPs, err := addressList(hostIP)
	if err != nil {
		return nil, fmt.Errorf("%s: hostIP: %w", what, err)
	}
	if err := c.ensureNamespace(ctx, ns); err != nil {
		return nil, fmt.Errorf("%s: namespace: %w", what, err)
	}
	if err := c.ensureDefaultServiceAccount(ctx, ns); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}

	container := map[string]any{"name": "app", "image": PodImage}
	if len(ports) > 0 {
		var list []any
		if err := roundTrip(ports, &list); err != nil {
			return nil, fmt.Errorf("%s: ports: %w", what, err)
		}
		container["ports"] = list
	}
	metadata := map[string]any{"name": name, "namespace": ns}
	if len(labels) > 0 {
		l := map[string]any{}
		for k, v := range labels {
			l[k] = v
		}
		metadata["labels"] = l
	}
	now := time.Now().UTC().Format(time.RFC3339)
	var conditions []any
	for _, cond := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		conditions = append(conditions, map[string]any{"type": string(cond), "status": "True", "lastTransitionTime": now})
	}
	obj := unstructuredOf(map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   metadata,
		"spec": map[string]any{
			"nodeName":   node,
			"containers": []any{container},
		},
		"status": map[string]any{
			"phase":      string(corev1.PodRunning),
			"conditions": conditions,
			"podIP":      podIPs[0],
			"podIPs":     ipList(podIPs),
			"hostIP":     hostIPs[0],
			"hostIPs":    ipList(hostIPs),
			"startTime":  now,
			"containerStatuses": []any{map[string]any{
				"name":         "app",
				"image":        PodImage,
				"imageID":      "",
				"ready":        true,
				"started":      true,
				"restartCount": int64(0),
				"state":        map[string]any{"running": map[string]any{"startedAt": now}},
			}},
		},
	})
	res, err := c.Apply(ctx, obj)
	if err != nil {
		return nil, err
	}
	var pod corev1.Pod
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(res.Object, &pod); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return &pod, nil
}

// DeletePod deletes the pod namespace/name at once (grace period 0, as
// `kubectl delete --force --grace-period=0`: no kubelet is there to
// confirm a graceful end) and waits until it is gone. A pod that is
// already gone is not an error.
func (c *Cluster) DeletePod(t testing.TB, ns, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ri := c.dyn.Resource(pods).Namespace(ns)
	err := ri.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod %s/%s: %s", ns, name, err)
	}
	for {
		_, err := ri.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("delete pod %s/%s: still there: %s", ns, name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ensureDefaultServiceAccount creates the ServiceAccount "default" of ns
// when it is missing (the controller-manager would).
func (c *Cluster) ensureDefaultServiceAccount(ctx context.Context, ns string) error {
	sa := unstructuredOf(map[string]any{
		"apiVersion": "v1", "kind": "ServiceAccount",
		"metadata": map[string]any{"name": "default", "namespace": ns},
	})
	_, err := c.dyn.Resource(serviceAccounts).Namespace(ns).Create(ctx, sa, createOptions)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service account %s/default: %w", ns, err)
	}
	return nil
}

// addressList parses one address, or one per family separated by a comma.
func addressList(s string) ([]string, error) {
	var out []string
	families := map[bool]bool{} // is4
	for _, f := range strings.Split(s, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if families[a.Is4()] {
			return nil, fmt.Errorf("%q: two addresses of one family", s)
		}
		families[a.Is4()] = true
		out = append(out, a.String())
	}
	return out, nil
}

func ipList(addrs []string) []any {
	out := make([]any, len(addrs))
	for i, a := range addrs {
		out[i] = map[string]any{"ip": a}
	}
	return out
}

// roundTrip converts v to out through JSON (typed API objects to the
// maps of an unstructured object).
func roundTrip(v, out any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, out)
}
