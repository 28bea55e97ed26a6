package infra

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// NodeFlags are the node-wide flags of the standalone agent; they become a
// nodeconfig.Config. They are the settings a Cilium agent owns, with
// Cilium's names and defaults, so that one command line means the same to
// both; in the Cilium build Cilium declares them and fills nodeconfig.Config.
type NodeFlags struct {
	EnableIPv4 bool   `mapstructure:"enable-ipv4"`
	EnableIPv6 bool   `mapstructure:"enable-ipv6"`
	BPFRoot    string `mapstructure:"bpf-root"`
	StateDir   string `mapstructure:"state-dir"`

	EnableBPFMasquerade  bool `mapstructure:"enable-bpf-masquerade"`
	EnableIPv4Masquerade bool `mapstructure:"enable-ipv4-masquerade"`
	EnableIPv6Masquerade bool `mapstructure:"enable-ipv6-masquerade"`

	EnableIPMasqAgent     bool   `mapstructure:"enable-ip-masq-agent"`
	IPMasqAgentConfigPath string `mapstructure:"ip-masq-agent-config-path"`

	IPAM                  string `mapstructure:"ipam"`
	IPv4NativeRoutingCIDR string `mapstructure:"ipv4-native-routing-cidr"`
	IPv6NativeRoutingCIDR string `mapstructure:"ipv6-native-routing-cidr"`
}

var defaultNodeFlags = NodeFlags{
	EnableIPv4: true,
	EnableIPv6: false,
	BPFRoot:    "/sys/fs/bpf",
	StateDir:   "/var/run/enimasq",

	EnableBPFMasquerade:  false,
	EnableIPv4Masquerade: true,
	EnableIPv6Masquerade: true,

	EnableIPMasqAgent:     false,
	IPMasqAgentConfigPath: nodeconfig.DefaultIPMasqAgentConfigPath,

	IPAM: nodeconfig.IPAMModeENI,
}

func (def NodeFlags) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-ipv4", def.EnableIPv4, "Program IPv4 state on this node")
	flags.Bool("enable-ipv6", def.EnableIPv6, "Program IPv6 state on this node")
	flags.String("bpf-root", def.BPFRoot, "bpffs mount point; a bpffs is mounted there if none is")
	flags.String("state-dir", def.StateDir, "Directory for sockets, checkpoints and the agent lock (created 0700)")
	flags.Bool("enable-bpf-masquerade", def.EnableBPFMasquerade, "Masquerade in BPF (the ip-masq-agent programs Cilium's ipmasq maps)")
	flags.Bool("enable-ipv4-masquerade", def.EnableIPv4Masquerade, "Masquerade IPv4 traffic leaving the node")
	flags.Bool("enable-ipv6-masquerade", def.EnableIPv6Masquerade, "Masquerade IPv6 traffic leaving the node")
	flags.Bool("enable-ip-masq-agent", def.EnableIPMasqAgent, "Read the non-masquerade CIDRs from the ip-masq-agent config file (needs --enable-bpf-masquerade)")
	flags.String("ip-masq-agent-config-path", def.IPMasqAgentConfigPath, "ip-masq-agent config file (YAML or JSON); its directory is watched")
	flags.String("ipam", def.IPAM, `IP address management mode; only "eni" (AWS ENI, from the CiliumNode file) is supported`)
	flags.String("ipv4-native-routing-cidr", def.IPv4NativeRoutingCIDR, "CIDR reachable without masquerading, added to the CIDRs of every IPv4 allocation")
	flags.String("ipv6-native-routing-cidr", def.IPv6NativeRoutingCIDR, "CIDR reachable without masquerading, added to the CIDRs of every IPv6 allocation")
}

func newNodeConfig(f NodeFlags) (nodeconfig.Config, error) {
	switch {
	case !f.EnableIPv4 && !f.EnableIPv6:
		return nodeconfig.Config{}, errors.New("--enable-ipv4 and --enable-ipv6 are both false: enable at least one family")
	case f.BPFRoot == "" || !filepath.IsAbs(f.BPFRoot):
		return nodeconfig.Config{}, fmt.Errorf("--bpf-root %q: must be an absolute path", f.BPFRoot)
	case f.StateDir == "" || !filepath.IsAbs(f.StateDir):
		return nodeconfig.Config{}, fmt.Errorf("--state-dir %q: must be an absolute path", f.StateDir)
	case f.IPAM != nodeconfig.IPAMModeENI:
		return nodeconfig.Config{}, fmt.Errorf("--ipam %q is not supported: the only IPAM mode is %q", f.IPAM, nodeconfig.IPAMModeENI)
	}
	cfg := nodeconfig.Config{
		EnableIPv4: f.EnableIPv4,
		EnableIPv6: f.EnableIPv6,
		BPFRoot:    filepath.Clean(f.BPFRoot),
		StateDir:   filepath.Clean(f.StateDir),
		Masquerade: nodeconfig.Masquerade{
			BPF:  f.EnableBPFMasquerade,
			IPv4: f.EnableIPv4Masquerade,
			IPv6: f.EnableIPv6Masquerade,
		},
		IPMasqAgent: nodeconfig.IPMasqAgent{
			Enabled:    f.EnableIPMasqAgent,
			ConfigPath: f.IPMasqAgentConfigPath,
		},
		IPAM: nodeconfig.IPAM{
			Mode:      f.IPAM,
			Allocator: nodeconfig.AllocatorEnimasq,
			PodRules:  nodeconfig.EnimasqPodRules,
		},
	}
	if err := cfg.IPMasqAgent.Validate(cfg.Masquerade); err != nil {
		return nodeconfig.Config{}, err
	}
	var err error
	if cfg.IPAM.IPv4NativeRoutingCIDR, err = nativeRoutingCIDR("ipv4", f.IPv4NativeRoutingCIDR); err != nil {
		return nodeconfig.Config{}, err
	}
	if cfg.IPAM.IPv6NativeRoutingCIDR, err = nativeRoutingCIDR("ipv6", f.IPv6NativeRoutingCIDR); err != nil {
		return nodeconfig.Config{}, err
	}
	return cfg, nil
}

// nativeRoutingCIDR parses --ipv4/ipv6-native-routing-cidr ("" is unset).
func nativeRoutingCIDR(family, flag string) (netip.Prefix, error) {
	if flag == "" {
		return netip.Prefix{}, nil
	}
	p, err := netip.ParsePrefix(strings.TrimSpace(flag))
	if err != nil || p.Addr().Is4() != (family == "ipv4") {
		return netip.Prefix{}, fmt.Errorf("--%s-native-routing-cidr %q: not an %s CIDR", family, flag, strings.ToUpper(family[:2])+family[2:])
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("--%s-native-routing-cidr %q: host bits set (did you mean %s?)", family, flag, p.Masked())
	}
	return p, nil
}

// ErrAlreadyRunning is returned when another agent holds the state dir or
// the network namespace.
var ErrAlreadyRunning = errors.New("already running")

// NetNSLockDir holds a lock per network namespace (netns-DEV-INODE.lock):
// one agent per namespace, whatever its state dir, since two would hand out
// the same IPs and fight over the same rules. It is under the default state
// dir, which the DaemonSet mounts from the host: agents in two containers
// of one node see the same locks.
const NetNSLockDir = "/var/run/enimasq/netns"

// prepareNode creates the state dir, takes the agent lock in it (so a second
// agent on the same state dir stops before touching the first one's sockets)
// and makes sure a bpffs is mounted at the BPF root. It is the first start
// hook: every invoke (flag validation included) has run, so a bad flag fails
// before the node is touched, and nothing else starts on a node the agent
// cannot own.
func prepareNode(lc cell.Lifecycle, log *slog.Logger, health cell.Health, cfg nodeconfig.Config) {
	var lock nodeLocks
	lc.Append(cell.Hook{
		OnStart: func(cell.HookContext) (err error) {
			lock, err = claimNode(log, cfg)
			if err == nil {
				health.OK(fmt.Sprintf("IPv4 %t, IPv6 %t, bpffs at %s, state in %s",
					cfg.EnableIPv4, cfg.EnableIPv6, cfg.BPFRoot, cfg.StateDir))
			}
			return err
		},
		OnStop: func(cell.HookContext) error { return lock.Close() },
	})
}

// nodeLocks are the locks an agent holds while it runs.
type nodeLocks []*os.File

func (l nodeLocks) Close() error {
	var errs []error
	for _, f := range l {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

func claimNode(log *slog.Logger, cfg nodeconfig.Config) (nodeLocks, error) {
	if err := MkdirPrivate(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("--state-dir %s: %w", cfg.StateDir, err)
	}
	stateLock, err := flock(filepath.Join(cfg.StateDir, "agent.lock"), "on --state-dir "+cfg.StateDir)
	if err != nil {
		return nil, err
	}
	locks := nodeLocks{stateLock}
	netnsLock, err := lockNetNS(NetNSLockDir)
	if err != nil {
		locks.Close()
		return nil, err
	}
	locks = append(locks, netnsLock)
	if err := EnsureBPFFS(log, cfg.BPFRoot); err != nil {
		locks.Close()
		return nil, err
	}
	return locks, nil
}

// lockNetNS takes the lock of the agent's network namespace in dir, named
// by the namespace's device and inode (what identifies a namespace).
func lockNetNS(dir string) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return nil, fmt.Errorf("network namespace of the agent: %w", err)
	}
	if err := MkdirPrivate(dir); err != nil {
		return nil, fmt.Errorf("network namespace lock dir %s: %w", dir, err)
	}
	where := fmt.Sprintf("in this network namespace (net:[%d])", st.Ino)
	return flock(filepath.Join(dir, fmt.Sprintf("netns-%d-%d.lock", st.Dev, st.Ino)), where)
}

// flock takes an exclusive lock on path without waiting; held by another
// process, it fails with ErrAlreadyRunning saying where.
func flock(path, where string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agent lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another enimasq-agent is already running %s (lock %s held): %w", where, path, ErrAlreadyRunning)
		}
		return nil, fmt.Errorf("agent lock %s: %w", path, err)
	}
	return f, nil
}

// MkdirPrivate creates dir (and parents) 0700, whatever the process umask.
// An existing directory is left as it is, unless others can write to it.
func MkdirPrivate(dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		// An existing directory (a --api-sock-path in /run, say) is not
		// the agent's to chmod; a writable-by-others one is refused.
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
			return fmt.Errorf("%s is writable by group or others (%s)", dir, fi.Mode().Perm())
		}
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// EnsureBPFFS mounts a bpffs at root unless one is mounted there already.
func EnsureBPFFS(log *slog.Logger, root string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := MkdirPrivate(root); err != nil {
		return fmt.Errorf("--bpf-root %s: no bpffs mounted and cannot create the mount point: %w", root, err)
	}
	if err := unix.Mount("bpffs", root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("--bpf-root %s: no bpffs mounted and mounting one failed: %w", root, err)
	}
	log.Info("Mounted bpffs", "path", root)
	return nil
}

// NodeConfigCell provides nodeconfig.Config from the node-wide flags.
var NodeConfigCell = cell.Group(
	cell.Config(defaultNodeFlags),
	cell.Provide(newNodeConfig),
)

// nodeCell is NodeConfigCell plus the agent's claim on the node: the lock on
// the state dir and the bpffs mount.
var nodeCell = cell.Module(
	"node",
	"Node-wide configuration",

	NodeConfigCell,
	cell.Invoke(prepareNode),
)
