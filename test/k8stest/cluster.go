// Package k8stest runs a real Kubernetes API server for tests: etcd and
// kube-apiserver, built from the Go module proxy by
// test/k8stest/apiserver-build/build.sh (`make k8s-bins`), on loopback with free
// ports and temporary directories, with the CRDs of test/k8stest/crds installed.
//
//	c := k8stest.Start(t) // skips when the binaries are not built
//	agentFlags := []string{"--k8s-kubeconfig-path=" + c.Kubeconfig}
//
// The API server authorizes with RBAC. The admin (Config, Kubeconfig) is in
// system:masters; ServiceAccountKubeconfig gives a kubeconfig with a service
// account's token, to test what a ClusterRole grants. StopAPIServer and
// StartAPIServer take the API server away and bring it back on the same
// address with the same data, as an outage would.
package k8stest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The versions build.sh builds; the cache directory is named after them.
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.6.16"
)

// Environment variables.
const (
	// BinDirEnv overrides the directory of the binaries (build.sh honours
	// it too).
	BinDirEnv = "ENIMASQ_K8S_BIN_DIR"
	// RequireEnv, when set (make test sets it), turns the skip for missing
	// binaries into a failure, so that CI cannot pass without these tests.
	RequireEnv = "ENIMASQ_REQUIRE_K8S"
)

// BinDir is where build.sh caches kube-apiserver and etcd:
// $ENIMASQ_K8S_BIN_DIR, else ${XDG_CACHE_HOME:-~/.cache}/enimasq/
// k8s-v1.37.2-etcd-v3.6.16.
func BinDir() (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		return dir, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "enimasq", "k8s-"+KubernetesVersion+"-etcd-"+EtcdVersion), nil
}

// Binaries returns the paths of kube-apiserver and etcd, or an error that
// says how to build them.
func Binaries() (kubeAPIServer, etcd string, err error) {
	dir, err := BinDir()
	if err != nil {
		return "", "", err
	}
	kubeAPIServer, etcd = filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "etcd")
	for _, bin := range []string{kubeAPIServer, etcd} {
		if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
			return "", "", fmt.Errorf("%s is not built: run `make k8s-bins` (test/k8stest/apiserver-build/build.sh, about 10 minutes the first time)", bin)
		}
	}
	return kubeAPIServer, etcd, nil
}

// SourceDir is test/k8stest in the source tree.
func SourceDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// CRDDir holds the test CRDs (CiliumNode, PolicyEndpoint) that Start installs.
func CRDDir() string { return filepath.Join(SourceDir(), "crds") }

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	// Dir holds the data, certificates, keys and logs.
	Dir string
	// Server is the API server's URL (https://127.0.0.1:PORT).
	Server string
	// Kubeconfig is the path of an admin kubeconfig file.
	Kubeconfig string
	// Config is the admin client configuration (system:masters).
	Config *rest.Config

	t          testing.TB
	apiBin     string
	apiArgs    []string
	etcd       *process
	mu         sync.Mutex
	api        *process
	dyn        dynamic.Interface
	mapper     *restmapper.DeferredDiscoveryRESTMapper
	adminToken string
}

const readyTimeout = 90 * time.Second

// Start starts etcd and kube-apiserver for the test, waits until the API
// server is ready, writes the admin kubeconfig, installs the CRDs of CRDDir
// and stops everything at cleanup. Without the binaries the test is
// skipped (failed if $ENIMASQ_REQUIRE_K8S is set).
func Start(t testing.TB) *Cluster {
	t.Helper()
	apiBin, etcdBin, err := Binaries()
	if err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("%s is set: %s", RequireEnv, err)
		}
		t.Skipf("needs a real API server: %s", err)
	}
	c := &Cluster{t: t, Dir: t.TempDir(), apiBin: apiBin}

	// etcd, on two free ports; a port taken meanwhile is retried.
	for attempt := 1; ; attempt++ {
		client, err1 := FreeAddress()
		peer, err2 := FreeAddress()
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		clientURL, peerURL := "http://"+client, "http://"+peer
		data := filepath.Join(c.Dir, "etcd")
		c.etcd, err = startProcess("etcd", filepath.Join(c.Dir, "etcd.log"), etcdBin,
			"--name=default",
			"--data-dir="+data,
			"--listen-client-urls="+clientURL,
			"--advertise-client-urls="+clientURL,
			"--listen-peer-urls="+peerURL,
			"--initial-advertise-peer-urls="+peerURL,
			"--initial-cluster=default="+peerURL,
			"--unsafe-no-fsync",
			"--log-level=warn",
		)
		if err != nil {
			t.Fatal(err)
		}
		err = waitFor(readyTimeout, c.etcd, func() error { return etcdHealthy(clientURL) })
		if err == nil {
			c.apiArgs = c.apiServerArgs(clientURL)
			break
		}
		c.etcd.stop()
		if attempt == 3 || !c.etcd.portInUse() {
			t.Fatalf("etcd: %s\n%s", err, c.etcd.logTail())
		}
		os.RemoveAll(data)
	}
	t.Cleanup(func() { c.etcd.stop() })
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.api != nil {
			c.api.stop()
		}
		if t.Failed() {
			t.Logf("kube-apiserver log (end):\n%s", c.api.logTail())
			t.Logf("etcd log (end):\n%s", c.etcd.logTail())
		}
	})

	if err := c.startAPIServer(true); err != nil {
		t.Fatal(err)
	}
	c.InstallCRDs(t, CRDDir())
	return c
}

// apiServerArgs writes the keys and tokens and returns kube-apiserver's
// flags, with a free port in --secure-port.
func (c *Cluster) apiServerArgs(etcdURL string) []string {
	t := c.t
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	saKey := filepath.Join(c.Dir, "sa.key")
	writeFile(t, saKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	token := make([]byte, 16)
	rand.Read(token)
	c.adminToken = hex.EncodeToString(token)
	tokens := filepath.Join(c.Dir, "tokens.csv")
	writeFile(t, tokens, []byte(c.adminToken+`,admin,admin,"system:masters"`+"\n"))
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none", // a loopback address cannot be an endpoint
		"--cert-dir=" + filepath.Join(c.Dir, "certs"),
		"--authorization-mode=RBAC",
		"--allow-privileged=true", // as every cluster that runs a CNI or Cilium
		"--token-auth-file=" + tokens,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.96.0.0/12",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		// Without it, an open watch holds a SIGTERM'ed API server for 20 s.
		"--shutdown-watch-termination-grace-period=1s",
	}
}

// startAPIServer starts kube-apiserver and waits until /readyz answers. The
// first start picks a free port (retried if it was taken meanwhile) and
// builds the clients; later starts reuse the port and the certificates.
func (c *Cluster) startAPIServer(first bool) error {
	for attempt := 1; ; attempt++ {
		port := ""
		if first {
			addr, err := FreeAddress()
			if err != nil {
				return err
			}
			_, port, _ = net.SplitHostPort(addr)
			c.Server = "https://" + addr
		} else {
			_, port, _ = strings.Cut(strings.TrimPrefix(c.Server, "https://"), ":")
		}
		args := append(slices.Clone(c.apiArgs), "--secure-port="+port)
		p, err := startProcess("kube-apiserver", filepath.Join(c.Dir, "kube-apiserver.log"), c.apiBin, args...)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.api = p
		c.mu.Unlock()
		caFile := filepath.Join(c.Dir, "certs", "apiserver.crt")
		err = waitFor(readyTimeout, p, func() error {
			if c.Config == nil {
				if _, err := os.Stat(caFile); err != nil {
					return err
				}
				if err := c.setupClients(caFile); err != nil {
					return err
				}
			}
			return c.ready()
		})
		if err == nil {
			return nil
		}
		p.stop()
		if !first || attempt == 3 || !p.portInUse() {
			return fmt.Errorf("kube-apiserver: %w\n%s", err, p.logTail())
		}
	}
}

func (c *Cluster) setupClients(caFile string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	cfg := &rest.Config{
		Host:            c.Server,
		BearerToken:     c.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		QPS:             100,
		Burst:           200,
	}
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, c.Server, ca, "admin", c.adminToken); err != nil {
		return err
	}
	if c.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	c.Config = cfg
	return nil
}

// ready is nil when /readyz answers ok.
func (c *Cluster) ready() error {
	rc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.Server+"/readyz", nil)
	resp, err := rc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s: %s", resp.Status, lastLines(body.String(), 5))
	}
	return nil
}

// Dynamic is an admin dynamic client.
func (c *Cluster) Dynamic() dynamic.Interface { return c.dyn }

// StopAPIServer stops kube-apiserver (SIGTERM, as a node drain or a crash
// loop would take it away); etcd and its data stay.
func (c *Cluster) StopAPIServer(t testing.TB) {
	t.Helper()
	if err := c.stopAPIServer(); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) stopAPIServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.api == nil || c.api.exited() {
		return errors.New("kube-apiserver is not running")
	}
	c.api.stop()
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the same
// address with the same certificates, keys and data, and waits until it is
// ready.
func (c *Cluster) StartAPIServer(t testing.TB) {
	t.Helper()
	if err := c.restartAPIServer(); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) restartAPIServer() error {
	c.mu.Lock()
	running := c.api != nil && !c.api.exited()
	c.mu.Unlock()
	if running {
		return errors.New("kube-apiserver is running")
	}
	return c.startAPIServer(false)
}

// ServiceAccountKubeconfig writes a kubeconfig that authenticates as the
// service account namespace/name (which must exist) with a token from the
// TokenRequest API, as a pod of that service account would, and returns its
// path.
func (c *Cluster) ServiceAccountKubeconfig(t testing.TB, namespace, name string) string {
	t.Helper()
	token := c.ServiceAccountToken(t, namespace, name)
	path := filepath.Join(c.Dir, namespace+"-"+name+".kubeconfig")
	if err := writeKubeconfig(path, c.Server, c.Config.CAData, "system:serviceaccount:"+namespace+":"+name, token); err != nil {
		t.Fatal(err)
	}
	return path
}

// ServiceAccountToken returns a token (valid one hour) of the service
// account namespace/name.
func (c *Cluster) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := map[string]any{
		"apiVersion": "authentication.k8s.io/v1",
		"kind":       "TokenRequest",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"expirationSeconds": int64(3600)},
	}
	res, err := c.dyn.Resource(serviceAccounts).Namespace(namespace).Create(ctx, unstructuredOf(req), createOptions, "token")
	if err != nil {
		t.Fatalf("token for service account %s/%s: %s", namespace, name, err)
	}
	token, _, _ := unstructured.NestedString(res.Object, "status", "token")
	if token == "" {
		t.Fatalf("token for service account %s/%s: empty token in %v", namespace, name, res.Object)
	}
	return token
}

func writeKubeconfig(path, server string, ca []byte, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	cfg.CurrentContext = "test"
	return clientcmd.WriteToFile(*cfg, path)
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// launcher is a goroutine locked to its OS thread for the life of the
// process. The parent-death signal fires when the thread that forked the
// child exits, and Go ends a thread when a goroutine that locked it exits
// (as network-namespace helpers do): forking from this thread, which never
// exits, ties the children's life to the test process and nothing else.
var launcher = sync.OnceValue(func() chan<- func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked
		for f := range ch {
			f()
		}
	}()
	return ch
})
