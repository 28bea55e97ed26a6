package k8stest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The AWS network policy controller
// (github.com/aws/amazon-network-policy-controller-k8s), run against a
// Cluster: it is what writes the PolicyEndpoints and ClusterPolicyEndpoints
// that enimasq reads, from the NetworkPolicies, ClusterNetworkPolicies,
// ApplicationNetworkPolicies, pods and namespaces of the API server. A test
// that lets it write the objects tests enimasq on what the AWS agent is
// given, not on what the test's author believes the controller writes.
//
// test/k8stest/controller-build/build.sh (`make aws-np-controller`, part of
// `make k8s-bins`) builds it from the Go module proxy and caches it with the
// module's CRDs:
//
//	c := k8stest.Start(t)
//	ctl := k8stest.StartController(t, c, 200)
//	c.RunningPod(t, "shop", "web-0", "node-1", "10.0.1.5", "192.168.0.1", map[string]string{"app": "web"})
//	// apply a NetworkPolicy: the controller writes its PolicyEndpoints
//	ctl.Restart(t, 2) // the same policies, cut into slices of 2

// The controller's module and the version build.sh builds, which its
// go.mod pins (TestControllerCRDs checks that they agree).
const (
	ControllerModule  = "github.com/aws/amazon-network-policy-controller-k8s"
	ControllerVersion = "v1.1.10"
)

// ControllerDir is where build.sh caches the controller and its CRDs:
// aws-network-policy-controller-v1.1.10 in BinDir.
func ControllerDir() (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "aws-network-policy-controller-"+ControllerVersion), nil
}

// ControllerBinary returns the built controller, or an error that says how
// to build it.
func ControllerBinary() (string, error) {
	dir, err := ControllerDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "controller")
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not built: run `make aws-np-controller` (test/k8stest/controller-build/build.sh, a few minutes the first time)", bin)
	}
	return bin, nil
}

// ControllerCRDDir holds the CRDs of the controller's module
// (config/crd/bases, unchanged), which build.sh puts next to the binary:
// those the controller installs itself at start.
func ControllerCRDDir() (string, error) {
	dir, err := ControllerDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "crds"), nil
}

// Controller is a running AWS network policy controller.
type Controller struct {
	// Log is the controller's log file (every run of it, appended).
	Log string

	c     *Cluster
	bin   string
	crds  []string // the names of the CRDs it installs
	extra []string

	mu        sync.Mutex
	p         *process
	chunkSize int
}

// controllerReadyTimeout bounds a start: the CRDs established (the
// controller polls them every second), the caches synced.
const controllerReadyTimeout = 90 * time.Second

// StartController runs the controller against c with the admin
// kubeconfig: no leader election, no wait for the amazon-vpc-cni
// ConfigMap (--enable-configmap-check=false: there is no VPC CNI here), no
// metrics or health listener, and --endpoint-chunk-size=chunkSize (how
// many pods, and how many peer entries of each direction, one
// PolicyEndpoint holds; the controller's default is 200), then extra (a
// flag given again there wins, as pflag takes the last). It returns once
// the controller's CRDs are established and its workers run;
// the controller stops at cleanup, and on a failure the end of its log is
// shown. Without the binary the test is skipped (failed if
// $ENIMASQ_REQUIRE_K8S is set), as Start does.
func StartController(t testing.TB, c *Cluster, chunkSize int, extra ...string) *Controller {
	t.Helper()
	bin, err := ControllerBinary()
	if err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("%s is set: %s", RequireEnv, err)
		}
		t.Skipf("needs the AWS network policy controller: %s", err)
	}
	crdDir, err := ControllerCRDDir()
	if err != nil {
		t.Fatal(err)
	}
	crds, err := crdNames(crdDir)
	if err != nil {
		t.Fatalf("the controller's CRDs: %s", err)
	}
	ctl := &Controller{
		Log:   filepath.Join(t.TempDir(), "aws-network-policy-controller.log"),
		c:     c,
		bin:   bin,
		crds:  crds,
		extra: extra,
	}
	t.Cleanup(func() {
		ctl.Stop()
		if t.Failed() {
			t.Logf("AWS network policy controller log (end):\n%s", ctl.LogTail())
		}
	})
	if err := ctl.start(chunkSize); err != nil {
		t.Fatal(err)
	}
	return ctl
}

// crdNames reads the names of the CRDs of dir's *.yaml files.
func crdNames(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var crd struct {
			Kind     string            `json:"kind"`
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(data, &crd); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if crd.Kind != "CustomResourceDefinition" || crd.Metadata.Name == "" {
			return nil, fmt.Errorf("%s: not a CustomResourceDefinition", f)
		}
		names = append(names, crd.Metadata.Name)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no CRDs in %s", dir)
	}
	sort.Strings(names)
	return names, nil
}

// ChunkSize is the --endpoint-chunk-size of the running controller.
func (ctl *Controller) ChunkSize() int {
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	return ctl.chunkSize
}

// start starts the controller and waits until it is ready: its CRDs
// established and the log line of controller-runtime's "Starting workers"
// written by this run.
func (ctl *Controller) start(chunkSize int) error {
	if chunkSize < 1 {
		return fmt.Errorf("controller: chunk size %d, want 1 or more", chunkSize)
	}
	var offset int64
	if st, err := os.Stat(ctl.Log); err == nil {
		offset = st.Size()
	}
	args := append([]string{
		"--kubeconfig=" + ctl.c.Kubeconfig,
		"--enable-leader-election=false",
		"--enable-configmap-check=false",
		"--metrics-bind-addr=0",
		"--health-probe-bind-addr=0",
		"--endpoint-chunk-size=" + strconv.Itoa(chunkSize),
	}, ctl.extra...)
	p, err := startProcess("aws-network-policy-controller", ctl.Log, ctl.bin, args...)
	if err != nil {
		return err
	}
	ctl.mu.Lock()
	ctl.p, ctl.chunkSize = p, chunkSize
	ctl.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), controllerReadyTimeout)
	defer cancel()
	err = waitFor(controllerReadyTimeout, p, func() error {
		if err := ctl.logSince(offset, `"Starting workers"`); err != nil {
			return err
		}
		for _, name := range ctl.crds {
			if err := ctl.c.waitEstablished(ctx, name); err != nil {
				return fmt.Errorf("CRD %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		p.stop()
		return fmt.Errorf("AWS network policy controller %s: %w\n%s", ControllerVersion, err, p.logTail())
	}
	ctl.c.mapper.Reset() // the kinds of the CRDs it installed
	return nil
}

// logSince is nil when the log holds want past offset.
func (ctl *Controller) logSince(offset int64, want string) error {
	data, err := os.ReadFile(ctl.Log)
	if err != nil {
		return err
	}
	if int64(len(data)) < offset || !strings.Contains(string(data[offset:]), want) {
		return fmt.Errorf("no %s in its log yet", want)
	}
	return nil
}

// Stop stops the controller (SIGTERM, SIGKILL after 10 s). The objects it
// wrote stay. Stopping a stopped controller does nothing.
func (ctl *Controller) Stop() {
	ctl.mu.Lock()
	p := ctl.p
	ctl.mu.Unlock()
	if p != nil {
		p.stop()
	}
}

// Restart stops the controller and starts it again with
// --endpoint-chunk-size=chunkSize (and the same other flags), and waits
// until it is ready. At start the controller reconciles every policy: with
// another chunk size, it cuts them into slices of the new size.
func (ctl *Controller) Restart(t testing.TB, chunkSize int) {
	t.Helper()
	ctl.Stop()
	if err := ctl.start(chunkSize); err != nil {
		t.Fatal(err)
	}
}

// LogTail returns the last lines of the controller's log.
func (ctl *Controller) LogTail() string {
	data, err := os.ReadFile(ctl.Log)
	if err != nil {
		return err.Error()
	}
	return lastLines(string(data), 40)
}
