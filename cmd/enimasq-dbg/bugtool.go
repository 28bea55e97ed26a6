package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// defaultLogGlobs are where the agent's logs are on a node: the kubelet's
// files of the DaemonSet's containers.
var defaultLogGlobs = []string{"/var/log/containers/enimasq*.log"}

// bugtoolCommand is `enimasq-dbg bugtool`, as cilium-bugtool: one tar.gz
// of what a bug report needs. A part that cannot be had is named, with its
// error, in errors.txt; the others are written all the same.
func bugtoolCommand(o *options) *cobra.Command {
	var archive, netns string
	var logs []string
	cmd := &cobra.Command{
		Use:   "bugtool",
		Short: "Write one archive (tar.gz) of status, tables, maps, rules, routes, programs and logs",
		Long: "Collects the agent's version, health, status, config, metrics and statedb tables\n" +
			"(through its API), the pinned maps and programs (bpf ipmasq list, bpf policy list,\n" +
			"bpf policy pods, bpf ct list, bpf progs), the node's ip rules, routes and links, and\n" +
			"the agent's logs (--log-file, default " + strings.Join(defaultLogGlobs, ", ") + ")\n" +
			"into one tar.gz, and prints its path.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stamp := time.Now().UTC().Format("20060102-150405")
			if archive == "" {
				archive = "enimasq-bugtool-" + stamp + ".tar.gz"
			}
			b := &bugtool{o: o, netns: netns, dir: "enimasq-bugtool-" + stamp, files: map[string][]byte{}}
			b.collect(logs)
			report := cmd.OutOrStdout()
			if archive == "-" {
				report = cmd.ErrOrStderr()
				if err := b.writeTo(cmd.OutOrStdout()); err != nil {
					return err
				}
			} else if err := b.write(archive); err != nil {
				return err
			}
			fmt.Fprintf(report, "wrote %s (%d files", archive, len(b.order))
			if len(b.errs) > 0 {
				fmt.Fprintf(report, ", %d parts missing: see errors.txt", len(b.errs))
			}
			fmt.Fprintln(report, ")")
			return nil
		},
	}
	cmd.Flags().StringVar(&archive, "archive", "", "The archive to write, - for stdout (default ./enimasq-bugtool-<time>.tar.gz)")
	cmd.Flags().StringArrayVar(&logs, "log-file", nil, "A log file (or glob) of the agent to include; repeatable")
	cmd.Flags().StringVar(&netns, "netns", "", "The named network namespace of the agent, for the ip rules, routes and links (default: this one)")
	cmd.Flags().StringVar(&o.bpfRoot, "bpf-root", "", bpfRootUsage)
	return cmd
}

type bugtool struct {
	o     *options
	netns string
	dir   string
	files map[string][]byte
	order []string
	errs  []string
}

func (b *bugtool) add(name string, data []byte) {
	if _, ok := b.files[name]; !ok {
		b.order = append(b.order, name)
	}
	b.files[name] = data
}

func (b *bugtool) fail(name string, err error) {
	b.errs = append(b.errs, fmt.Sprintf("%s: %v", name, err))
}

// dbg runs an enimasq-dbg command in this process and keeps its output;
// a failed command (a degraded status exits 1) keeps its output too.
func (b *bugtool) dbg(name string, args ...string) {
	var out bytes.Buffer
	root := newRootCommand()
	global := []string{"--state-dir", b.o.stateDir}
	if b.o.apiSocket != "" {
		global = append(global, "--socket", b.o.apiSocket)
	}
	if b.o.bpfRoot != "" && (args[0] == "bpf" || args[0] == "policy") {
		args = append(args, "--bpf-root", b.o.bpfRoot)
	}
	root.SetArgs(append(global, args...))
	root.SetOut(&out)
	root.SetErr(io.Discard)
	if err := root.Execute(); err != nil && !errors.Is(err, errDegraded) {
		b.fail(name, err)
		if out.Len() == 0 {
			return
		}
	}
	b.add(name, out.Bytes())
}

// command runs a program and keeps its output, or its error.
func (b *bugtool) command(name string, cmds ...[]string) {
	var out bytes.Buffer
	for _, c := range cmds {
		if b.netns != "" && c[0] == "ip" {
			c = append([]string{"ip", "-n", b.netns}, c[1:]...)
		}
		fmt.Fprintf(&out, "# %s\n", strings.Join(c, " "))
		run := exec.Command(c[0], c[1:]...)
		run.Stdout, run.Stderr = &out, &out
		if err := run.Run(); err != nil {
			b.fail(name, fmt.Errorf("%s: %w", strings.Join(c, " "), err))
		}
		out.WriteString("\n")
	}
	b.add(name, out.Bytes())
}

func (b *bugtool) get(name, path string) {
	code, body, err := apiGet(b.o, path)
	if err != nil {
		b.fail(name, err)
		return
	}
	if code >= 300 && code != 503 { // /healthz answers 503 when degraded
		b.fail(name, fmt.Errorf("GET %s: %d: %s", path, code, bytes.TrimSpace(body)))
		return
	}
	b.add(name, body)
}

func (b *bugtool) collect(logs []string) {
	b.dbg("version.txt", "version")
	b.get("health.json", "/healthz")
	b.dbg("status.txt", "status", "--verbose")
	b.dbg("status.json", "status", "--verbose", "-o", "json")
	b.get("config.json", "/v1/config")
	b.get("metrics.txt", "/metrics")
	b.get("statedb.json", "/statedb/dump")
	b.dbg("ipam-list.txt", "ipam", "list")
	b.dbg("bpf-ipmasq-list.txt", "bpf", "ipmasq", "list")
	b.dbg("bpf-policy-list.txt", "bpf", "policy", "list")
	b.dbg("bpf-policy-pods.txt", "bpf", "policy", "pods")
	b.dbg("bpf-ct-list.txt", "bpf", "ct", "list")
	b.dbg("bpf-progs.txt", "bpf", "progs")
	b.dbg("bpf-progs.json", "bpf", "progs", "-o", "json")
	b.command("ip-rules.txt", []string{"ip", "-4", "rule", "show"}, []string{"ip", "-6", "rule", "show"})
	b.command("ip-routes.txt", []string{"ip", "-4", "route", "show", "table", "all"}, []string{"ip", "-6", "route", "show", "table", "all"})
	b.command("ip-links.txt", []string{"ip", "-d", "link", "show"})
	if len(logs) == 0 {
		logs = defaultLogGlobs
	}
	found := 0
	for _, pattern := range logs {
		paths, err := filepath.Glob(pattern)
		if err != nil {
			b.fail("logs", err)
			continue
		}
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				b.fail("logs/"+filepath.Base(p), err)
				continue
			}
			b.add("logs/"+filepath.Base(p), data)
			found++
		}
	}
	if found == 0 {
		b.fail("logs", fmt.Errorf("no log file matches %s (give them with --log-file)", strings.Join(logs, ", ")))
	}
	b.add("errors.txt", []byte(strings.Join(b.errs, "\n")+"\n"))
}

// write writes the archive next to its path, then moves it there.
func (b *bugtool) write(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".bugtool-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := b.writeTo(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// writeTo writes the archive, gzipped tar, to w.
func (b *bugtool) writeTo(w io.Writer) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	now := time.Now()
	for _, name := range b.order {
		data := b.files[name]
		hdr := &tar.Header{Name: b.dir + "/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}
