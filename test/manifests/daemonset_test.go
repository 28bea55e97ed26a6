package manifests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/test/agentargs"

	"github.com/containernetworking/cni/libcni"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func daemonSet(t *testing.T, objs []*unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	ds := find(objs, "DaemonSet", "enimasq")
	if ds == nil {
		t.Fatal("no DaemonSet enimasq")
	}
	return ds
}

func field(o map[string]any, path ...string) any {
	v, _, _ := unstructured.NestedFieldNoCopy(o, path...)
	return v
}

// TestDaemonSet: the DaemonSet of each kustomization in line with Cilium's
// chart and aws-node: a rolling update of 10% of the nodes; not on
// Fargate, hybrid or EKS Auto Mode nodes; the bpffs mounted by the one
// privileged container, an init container, with Bidirectional propagation,
// and seen by the agent HostToContainer; the agent with an explicit
// capability list; a startup and a liveness probe on the API answering, a
// readiness probe on health; its args the agent's own flags.
func TestDaemonSet(t *testing.T) {
	for _, dir := range []string{"standalone", "network-policy"} {
		t.Run(dir, func(t *testing.T) {
			ds := daemonSet(t, render(t, filepath.Join(deployDir, dir)))
			if got := field(ds.Object, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable"); got != "10%" {
				t.Errorf("maxUnavailable %v, want 10%%", got)
			}
			terms, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "affinity", "nodeAffinity",
				"requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
			if len(terms) != 1 {
				t.Fatalf("%d node selector terms, want 1 (terms are ORed: each would need the exclusion)", len(terms))
			}
			exprs := map[string]string{}
			for _, e := range field(terms[0].(map[string]any), "matchExpressions").([]any) {
				e := e.(map[string]any)
				b, _ := json.Marshal(e["values"])
				exprs[e["key"].(string)] = e["operator"].(string) + " " + string(b)
			}
			for key, want := range map[string]string{
				"kubernetes.io/os":               `In ["linux"]`,
				"eks.amazonaws.com/compute-type": `NotIn ["fargate","hybrid","auto"]`,
			} {
				if exprs[key] != want {
					t.Errorf("node affinity %s: %q, want %q", key, exprs[key], want)
				}
			}

			var privileged []string
			for _, c := range podContainers(t, ds) {
				if p, _, _ := unstructured.NestedBool(c, "securityContext", "privileged"); p {
					privileged = append(privileged, c["name"].(string))
				}
			}
			if !slices.Equal(privileged, []string{"mount-bpf-fs"}) {
				t.Errorf("privileged containers %v, want [mount-bpf-fs] alone", privileged)
			}
			init, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "initContainers")
			if len(init) == 0 || init[0].(map[string]any)["name"] != "mount-bpf-fs" {
				t.Errorf("init containers %v: mount-bpf-fs is not first", names(init))
			}
			if got := mount(t, container(t, ds, "mount-bpf-fs"), "/sys/fs/bpf"); got != "Bidirectional" {
				t.Errorf("mount-bpf-fs: /sys/fs/bpf propagation %q", got)
			}

			agent := container(t, ds, "agent")
			if got := mount(t, agent, "/sys/fs/bpf"); got != "HostToContainer" {
				t.Errorf("agent: /sys/fs/bpf propagation %q, want HostToContainer", got)
			}
			caps := field(agent, "securityContext", "capabilities").(map[string]any)
			if !reflect.DeepEqual(caps["drop"], []any{"ALL"}) || len(caps["add"].([]any)) == 0 {
				t.Errorf("agent capabilities %v: want drop ALL and a list to add", caps)
			}
			for _, p := range []string{"startupProbe", "livenessProbe"} {
				if got := probe(agent, p); got != aliveProbe {
					t.Errorf("agent %s %q, want %q", p, got, aliveProbe)
				}
			}
			if got := probe(agent, "readinessProbe"); got != "enimasq-dbg health" {
				t.Errorf("agent readinessProbe %q", got)
			}

			if _, err := agentargs.Parse(agent); err != nil {
				t.Error(err)
			}
		})
	}
}

// aliveProbe passes while anything answers on the agent's socket:
// enimasq-dbg health exits 0 (healthy), 1 (degraded) or 2 (no answer).
const aliveProbe = "/bin/sh -c enimasq-dbg health >/dev/null 2>&1; test $? -ne 2"

func probe(c map[string]any, name string) string {
	cmd, _, _ := unstructured.NestedStringSlice(c, name, "exec", "command")
	return strings.Join(cmd, " ")
}

func mount(t *testing.T, c map[string]any, path string) string {
	t.Helper()
	if c == nil {
		t.Fatal("no such container")
	}
	for _, m := range c["volumeMounts"].([]any) {
		m := m.(map[string]any)
		if m["mountPath"] == path {
			p, _ := m["mountPropagation"].(string)
			return p
		}
	}
	t.Fatalf("container %s does not mount %s", c["name"], path)
	return ""
}

// TestProbes runs the probes' commands against an enimasq-dbg that exits
// as the real one does when the agent is healthy (0), degraded (1) or not
// answering (2): startup and liveness fail only on 2, readiness on 1 too.
func TestProbes(t *testing.T) {
	ds := daemonSet(t, render(t, filepath.Join(deployDir, "standalone")))
	agent := container(t, ds, "agent")
	for code, want := range map[int][3]bool{ // startup, liveness, readiness pass
		0: {true, true, true},
		1: {true, true, false},
		2: {false, false, false},
	} {
		bin := t.TempDir()
		fake := "#!/bin/sh\n[ \"$1\" = health ] || exit 99\necho degraded or not\nexit " + string(rune('0'+code)) + "\n"
		if err := os.WriteFile(filepath.Join(bin, "enimasq-dbg"), []byte(fake), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Setenv("PATH", bin+":/usr/bin:/bin") // the image's enimasq-dbg is in its PATH
		for i, p := range []string{"startupProbe", "livenessProbe", "readinessProbe"} {
			cmd, _, _ := unstructured.NestedStringSlice(agent, p, "exec", "command")
			err := exec.Command(cmd[0], cmd[1:]...).Run()
			if (err == nil) != want[i] {
				t.Errorf("enimasq-dbg health exiting %d: %s passes %t, want %t (%v)", code, p, err == nil, want[i], err)
			}
		}
	}
}

// TestInstallCNI runs the install-cni init container's script, its paths
// moved under a temporary directory, as root without capabilities when
// run as root (the container drops ALL): the plugin and the network
// configuration land whole under their names, no temporary file stays,
// the runtime's libcni reads the configuration as the example of cni.md,
// and a second run (an upgrade) replaces both.
func TestInstallCNI(t *testing.T) {
	objs := render(t, filepath.Join(deployDir, "standalone"))
	ds := daemonSet(t, objs)
	ctr := container(t, ds, "install-cni")
	if ctr == nil {
		t.Fatal("no install-cni init container")
	}
	cm := find(objs, "ConfigMap", "enimasq-cni-config")
	if cm == nil {
		t.Fatal("no ConfigMap enimasq-cni-config")
	}
	conflist, _, _ := unstructured.NestedString(cm.Object, "data", "10-enimasq.conflist")
	if mount(t, ctr, "/host/etc/cni/net.d") != "" || mount(t, ctr, "/host/opt/cni/bin") != "" {
		t.Error("install-cni mounts with propagation")
	}
	mount(t, ctr, "/etc/enimasq-cni")

	root := t.TempDir()
	for _, d := range []string{"host/opt/cni/bin", "host/etc/cni/net.d", "etc/enimasq-cni", "usr/local/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, data string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(root, path), []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/enimasq-cni/10-enimasq.conflist", conflist, 0o644)
	// Another plugin's configuration, as aws-node's would be: left alone.
	write("host/etc/cni/net.d/05-other.conflist", `{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"other"}]}`, 0o644)
	args, _, _ := unstructured.NestedStringSlice(ctr, "args")
	cmdline, _, _ := unstructured.NestedStringSlice(ctr, "command")
	script := args[0]
	for _, p := range []string{"/host/", "/usr/local/bin/", "/etc/enimasq-cni/"} {
		script = strings.ReplaceAll(script, " "+p, " "+root+p)
	}
	run := func(binary string) {
		t.Helper()
		write("usr/local/bin/enimasq-cni", binary, 0o755)
		argv := append(cmdline, script)
		if os.Geteuid() == 0 {
			if priv, err := exec.LookPath("setpriv"); err == nil {
				argv = append([]string{priv, "--bounding-set=-all", "--inh-caps=-all", "--"}, argv...)
			}
		}
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("install-cni: %s\n%s", err, out)
		}
		got, err := os.ReadFile(filepath.Join(root, "host/opt/cni/bin/enimasq-cni"))
		if err != nil || string(got) != binary {
			t.Fatalf("installed plugin %q, %v; want %q", got, err, binary)
		}
		if st, _ := os.Stat(filepath.Join(root, "host/opt/cni/bin/enimasq-cni")); st.Mode().Perm() != 0o755 {
			t.Errorf("plugin mode %v", st.Mode())
		}
		for _, d := range []string{"host/opt/cni/bin", "host/etc/cni/net.d"} {
			entries, _ := os.ReadDir(filepath.Join(root, d))
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".") {
					t.Errorf("%s: temporary file %s left", d, e.Name())
				}
			}
		}
	}
	run("#!/bin/sh\n# v1\n")
	run("#!/bin/sh\n# v2\n")

	files, err := libcni.ConfFiles(filepath.Join(root, "host/etc/cni/net.d"), []string{".conf", ".conflist", ".json"})
	if err != nil || len(files) != 2 {
		t.Fatalf("network configurations %v, %v; want 05-other and 10-enimasq", files, err)
	}
	list, err := libcni.ConfListFromFile(filepath.Join(root, "host/etc/cni/net.d/10-enimasq.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	if list.Name != "enimasq" || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "enimasq-cni" {
		t.Errorf("installed configuration: network %q, plugins %d", list.Name, len(list.Plugins))
	}
	example, err := os.ReadFile(filepath.Join("..", "..", "Documentation", "examples", "10-enimasq.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if json.Unmarshal([]byte(conflist), &a) != nil || json.Unmarshal(example, &b) != nil || !reflect.DeepEqual(a, b) {
		t.Errorf("the ConfigMap's configuration is not the example of cni.md:\n%s\n%s", conflist, example)
	}
}
