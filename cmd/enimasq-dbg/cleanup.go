package main

import (
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/enimasq/enimasq/ipam/datapath"
	"github.com/enimasq/enimasq/policymap/netpolicy/enforce"
)

// cleanupOptions are the flags of enimasq-dbg cleanup.
type cleanupOptions struct {
	bpfRoot      string
	ciliumSocket string
	keepIPMasq   bool
	wait         time.Duration
	// cniConfDir and cniBinDir hold what the DaemonSet's install-cni
	// wrote: the conflist and the plugin ("" leaves them).
	cniConfDir, cniBinDir string
}

// The files the DaemonSet installs for the kubelet's runtime.
const (
	cniConflist = "10-enimasq.conflist"
	cniPlugin   = "enimasq-cni"
)

func cleanupCommand(o *options) *cobra.Command {
	c := &cleanupOptions{}
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove everything enimasq left on this node (uninstall); refused while an agent runs",
		Long: `Removes what enimasq-agent leaves on the node after it stops: the tcx
links of the policy programs pinned in <bpf-root>/enimasq/links (detached
and unpinned) and the rest of <bpf-root>/enimasq, the tc filters named
enimasq-policy on every device, the enimasq_* maps pinned in
<bpf-root>/tc/globals, the ip rules and routes with protocol 237, and the
IPAM checkpoint in the state dir, and the CNI conflist and plugin the
DaemonSet installed (--cni-conf-dir, --cni-bin-dir). Cilium's cilium_ipmasq_v4/v6 pins go
too, unless Cilium runs (its agent answers on --cilium-socket, a
cilium-agent process runs, or a loaded program uses the map): then they
are Cilium's and stay. Nothing of another writer is touched (rules and
routes of other protocols, other filters, the clsact qdiscs).

It runs in the node's network namespace (hostNetwork) with the node's
bpffs and the agent's state dir. It takes the agent's locks first, and
refuses while an agent holds them (--wait waits for it to stop). It is
idempotent: a second run finds nothing and succeeds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCleanup(cmd.OutOrStdout(), o.stateDir, c)
		},
	}
	cmd.Flags().StringVar(&c.bpfRoot, "bpf-root", "/sys/fs/bpf", "The agent's bpffs mount point (its --bpf-root)")
	cmd.Flags().StringVar(&c.ciliumSocket, "cilium-socket", "/var/run/cilium/cilium.sock", "Cilium agent's API socket: while it answers, Cilium's cilium_ipmasq_* pins stay")
	cmd.Flags().BoolVar(&c.keepIPMasq, "keep-cilium-ipmasq-maps", false, "Keep the cilium_ipmasq_v4/v6 pins even when no Cilium runs")
	cmd.Flags().DurationVar(&c.wait, "wait", 0, "Wait up to this long for a running agent to stop (0: refuse at once)")
	cmd.Flags().StringVar(&c.cniConfDir, "cni-conf-dir", "/etc/cni/net.d", "Where the DaemonSet installed "+cniConflist+` ("": keep it)`)
	cmd.Flags().StringVar(&c.cniBinDir, "cni-bin-dir", "/opt/cni/bin", "Where the DaemonSet installed "+cniPlugin+` ("": keep it)`)
	return cmd
}

func runCleanup(w io.Writer, stateDir string, c *cleanupOptions) error {
	lock, err := holdNode(stateDir, c.wait)
	if err != nil {
		return err
	}
	defer lock.Close()
	// The Cilium build holds enimasq's state from inside Cilium's agent,
	// without enimasq's lock.
	if pid := ciliumWithEnimasq(); pid != "" {
		return fmt.Errorf("cilium-agent (pid %s) links enimasq's cells and keeps what cleanup would remove: stop it first", pid)
	}

	var removed, notes []string
	var errs []error
	add := func(what []string, err error) {
		removed = append(removed, what...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(enforce.Uninstall(filepath.Join(c.bpfRoot, "enimasq", "links")))
	add(removeTree(filepath.Join(c.bpfRoot, "enimasq")))
	globals := bpf.GlobalsDir(c.bpfRoot)
	add(removePins(globals, func(name string) bool { return strings.HasPrefix(name, "enimasq_") }))
	ipmasq := []string{bpf.IPMasqV4MapName, bpf.IPMasqV6MapName}
	switch cilium := ciliumRunning(c.ciliumSocket, globals, ipmasq); {
	case !anyPinned(globals, ipmasq):
	case c.keepIPMasq:
		notes = append(notes, "kept the cilium_ipmasq_v4/v6 pins in "+globals+": --keep-cilium-ipmasq-maps")
	case cilium != "":
		notes = append(notes, fmt.Sprintf("kept the cilium_ipmasq_v4/v6 pins in %s: Cilium runs (%s), the maps are its own", globals, cilium))
	default:
		add(removePins(globals, func(name string) bool { return slices.Contains(ipmasq, name) }))
		notes = append(notes, "removed the cilium_ipmasq_v4/v6 pins: no Cilium runs (no agent answers on "+c.ciliumSocket+
			", no cilium-agent process, no loaded program uses the maps)")
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		errs = append(errs, fmt.Errorf("netlink: %w", err))
	} else {
		add(datapath.Uninstall(nl))
		nl.Close()
	}
	add(removeState(stateDir))
	add(removeCNI(c.cniConfDir, c.cniBinDir))

	for _, r := range removed {
		fmt.Fprintln(w, "removed", r)
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	if len(removed) == 0 && len(errs) == 0 {
		fmt.Fprintln(w, "nothing of enimasq's is left on this node")
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup incomplete (run it again): %w", err)
	}
	return nil
}

// holdNode takes the agent's locks, waiting up to wait for an agent that
// holds them to stop.
func holdNode(stateDir string, wait time.Duration) (interface{ Close() error }, error) {
	deadline := time.Now().Add(wait)
	for {
		lock, err := infra.HoldNode(stateDir)
		if err == nil {
			return lock, nil
		}
		if !errors.Is(err, infra.ErrAlreadyRunning) {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("refused: an agent holds the node, stop it first (delete the DaemonSet, or wait with --wait): %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// removeTree removes dir and everything in it (pins in bpffs), listing
// each file removed.
func removeTree(dir string) ([]string, error) {
	var removed []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			removed = append(removed, "pin "+path)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("remove %s: %w", dir, err)
	}
	return removed, nil
}

// removePins removes the pins in dir whose name match says so.
func removePins(dir string, match func(string) bool) ([]string, error) {
	return removeEntries(dir, func(e fs.DirEntry) string {
		if match(e.Name()) {
			return "pin"
		}
		return ""
	})
}

// removeEntries removes the entries of dir that kind names (what each is,
// "" to keep it) and lists them as kind and path; a dir that is not there
// holds none.
func removeEntries(dir string, kind func(fs.DirEntry) string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		what := kind(e)
		if what == "" {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, what+" "+path)
	}
	return removed, errors.Join(errs...)
}

func anyPinned(dir string, names []string) bool {
	return slices.ContainsFunc(names, func(n string) bool {
		_, err := os.Stat(filepath.Join(dir, n))
		return err == nil
	})
}

// ciliumWithEnimasq is the pid of a running cilium-agent (in the caller's
// PID namespace) whose binary links enimasq's cells (Go's build info names
// the module), or "".
func ciliumWithEnimasq() string {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return ""
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "cilium-agent" {
			continue
		}
		info, err := buildinfo.ReadFile(filepath.Join("/proc", p.Name(), "exe"))
		if err != nil {
			continue
		}
		if info.Main.Path == enimasqModule || slices.ContainsFunc(info.Deps, func(m *debug.Module) bool { return m.Path == enimasqModule }) {
			return p.Name()
		}
	}
	return ""
}

const enimasqModule = "github.com/enimasq/enimasq"

// ciliumRunning says how a running Cilium was found ("" if none): its
// agent answers on its socket, a cilium-agent process runs (in the
// caller's PID namespace), or a loaded program (Cilium's datapath, which
// outlives its agent) uses one of the maps pinned in dir.
func ciliumRunning(socket, dir string, maps []string) string {
	if c, err := net.DialTimeout("unix", socket, time.Second); err == nil {
		c.Close()
		return "its agent answers on " + socket
	}
	if procs, err := os.ReadDir("/proc"); err == nil {
		for _, p := range procs {
			if _, err := strconv.Atoi(p.Name()); err != nil {
				continue
			}
			if comm, err := os.ReadFile(filepath.Join("/proc", p.Name(), "comm")); err == nil && strings.TrimSpace(string(comm)) == "cilium-agent" {
				return "process cilium-agent, pid " + p.Name()
			}
		}
	}
	ids := map[ebpf.MapID]string{}
	for _, name := range maps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue
		}
		if info, err := m.Info(); err == nil {
			if id, ok := info.ID(); ok {
				ids[id] = name
			}
		}
		m.Close()
	}
	if len(ids) == 0 {
		return ""
	}
	for id, err := ebpf.ProgramGetNextID(0); err == nil; id, err = ebpf.ProgramGetNextID(id) {
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		info, err := prog.Info()
		prog.Close()
		if err != nil {
			continue
		}
		used, _ := info.MapIDs()
		for _, m := range used {
			if name, ok := ids[m]; ok {
				return fmt.Sprintf("program %d %q uses %s", id, info.Name, name)
			}
		}
	}
	return ""
}

// removeCNI removes the conflist and the plugin that the DaemonSet's
// install-cni wrote, and nothing else of those directories.
func removeCNI(confDir, binDir string) ([]string, error) {
	var removed []string
	var errs []error
	for _, path := range []string{filepath.Join(confDir, cniConflist), filepath.Join(binDir, cniPlugin)} {
		if filepath.Dir(path) == "." {
			continue // the directory is ""
		}
		switch err := os.Remove(path); {
		case err == nil:
			removed = append(removed, path)
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// removeState removes the IPAM checkpoint (and a crashed write's
// temporary files) and the agent's sockets left in the state dir. The
// lock file stays: it is held while this runs.
func removeState(stateDir string) ([]string, error) {
	return removeEntries(stateDir, func(e fs.DirEntry) string {
		name := e.Name()
		switch {
		case name == allocator.CheckpointFile || strings.HasPrefix(name, "."+allocator.CheckpointFile+".tmp-"):
			return "IPAM checkpoint"
		case e.Type()&fs.ModeSocket != 0 && (name == "enimasq.sock" || name == "shell.sock"):
			return "socket"
		}
		return ""
	})
}
