package k8stest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"
	"golang.org/x/tools/txtar"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// ScriptCommands are script commands (for hive script tests) that act on
// the cluster the way kubectl and an outage would:
//
//	k8s/apply [--dry-run] FILE...            server-side apply (status too)
//	k8s/delete FILE...                       delete the objects of the files
//	k8s/get RESOURCE [NS/]NAME [FIELD.PATH]  print the object, or one field, as YAML
//	k8s/apiserver stop|start                 take kube-apiserver away, bring it back
func (c *Cluster) ScriptCommands() map[string]script.Cmd {
	return map[string]script.Cmd{
		"k8s/apply":     c.applyCmd(),
		"k8s/delete":    c.deleteCmd(),
		"k8s/get":       c.getCmd(),
		"k8s/apiserver": c.apiServerCmd(),
	}
}

const scriptTimeout = 60 * time.Second

// eachObject calls do for every object of the files, in order, within the
// script timeout; it stops at the first error.
func eachObject(s *script.State, files []string, do func(context.Context, *unstructured.Unstructured) error) error {
	ctx, cancel := context.WithTimeout(s.Context(), scriptTimeout)
	defer cancel()
	for _, f := range files {
		objs, err := decodePath(s.Path(f))
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if err := do(ctx, obj); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *Cluster) applyCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Server-side apply the objects of YAML or JSON files (and their status)",
			Args:    "files...",
			Flags: func(fs *pflag.FlagSet) {
				fs.Bool("dry-run", false, "Apply with dryRun=All: validate, store nothing")
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) == 0 {
				return nil, script.ErrUsage
			}
			dry, err := s.Flags.GetBool("dry-run")
			if err != nil {
				return nil, err
			}
			var opts []ApplyOption
			if dry {
				opts = append(opts, DryRun())
			}
			return nil, eachObject(s, args, func(ctx context.Context, obj *unstructured.Unstructured) error {
				res, err := c.Apply(ctx, obj, opts...)
				if err == nil {
					s.Logf("applied %s %s (resourceVersion %s)\n", res.GetKind(), name(res), res.GetResourceVersion())
				}
				return err
			})
		})
}

func (c *Cluster) deleteCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Delete the objects of YAML or JSON files and wait until they are gone", Args: "files..."},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) == 0 {
				return nil, script.ErrUsage
			}
			return nil, eachObject(s, args, func(ctx context.Context, obj *unstructured.Unstructured) error {
				err := c.Delete(ctx, obj)
				if err == nil {
					s.Logf("deleted %s %s\n", obj.GetKind(), name(obj))
				}
				return err
			})
		})
}

func (c *Cluster) getCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Print an object (without managedFields), or one field of it, as YAML",
			Args:    "resource [namespace/]name [field.path]",
			Detail: []string{
				"resource is a plural resource name (ciliumnodes, policyendpoints, configmaps).",
				"field.path is dot-separated (status.ipam.used); a missing field prints nothing.",
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 2 || len(args) > 3 {
				return nil, script.ErrUsage
			}
			gvr, err := c.mapper.ResourceFor(schema.GroupVersionResource{Resource: args[0]})
			if err != nil {
				c.mapper.Reset()
				if gvr, err = c.mapper.ResourceFor(schema.GroupVersionResource{Resource: args[0]}); err != nil {
					return nil, err
				}
			}
			ns, nm, namespaced := strings.Cut(args[1], "/")
			if !namespaced {
				ns, nm = "", args[1]
			}
			ctx, cancel := context.WithTimeout(s.Context(), scriptTimeout)
			defer cancel()
			obj, err := c.dyn.Resource(gvr).Namespace(ns).Get(ctx, nm, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			unstructured.RemoveNestedField(obj.Object, "metadata", "managedFields")
			var v any = obj.Object
			if len(args) == 3 {
				var found bool
				v, found, err = unstructured.NestedFieldNoCopy(obj.Object, strings.Split(args[2], ".")...)
				if err != nil {
					return nil, err
				}
				if !found {
					return func(*script.State) (string, string, error) { return "", "", nil }, nil
				}
			}
			out, err := yaml.Marshal(v)
			if err != nil {
				return nil, err
			}
			return func(*script.State) (string, string, error) { return string(out), "", nil }, nil
		})
}

func (c *Cluster) apiServerCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Stop kube-apiserver (etcd and the data stay), or start it again on the same address",
			Args:    "stop|start",
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			switch args[0] {
			case "stop":
				return nil, c.stopAPIServer()
			case "start":
				return nil, c.restartAPIServer()
			}
			return nil, fmt.Errorf("%q: want stop or start: %w", args[0], script.ErrUsage)
		})
}

func decodePath(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	objs, err := Decode(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s: %w", path, errors.New("no objects"))
	}
	return objs, nil
}

// Scripts calls run for each txtar file that matches pattern, in a subtest
// with an API server of its own: args are the file's #! arguments, with
// $KUBECONFIG replaced by the server's admin kubeconfig.
func Scripts(t *testing.T, pattern string, run func(t *testing.T, c *Cluster, file string, archive *txtar.Archive, args []string)) {
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts match %s", pattern)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			c := Start(t)
			archive, err := txtar.ParseFile(file)
			if err != nil {
				t.Fatal(err)
			}
			shebang, _, _ := strings.Cut(strings.TrimPrefix(string(archive.Comment), "#!"), "\n")
			run(t, c, file, archive, strings.Fields(strings.ReplaceAll(shebang, "$KUBECONFIG", c.Kubeconfig)))
		})
	}
}

// UnreachableKubeconfig writes a kubeconfig for an API server that never
// answers (127.0.0.1:1) and returns its path.
func UnreachableKubeconfig(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
