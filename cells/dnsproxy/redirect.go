package dnsproxy

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RulePriority is the priority of the redirect's ip rule (fwmark MARK/MARK
// lookup TABLE). It must come before every rule that could send a pod's
// DNS elsewhere: the ENI pod rules (`111: from <pod> to <cidr> lookup
// <eni table>`) would otherwise forward a packet TPROXY marked for local
// delivery out of an ENI. Only marked packets match it.
const RulePriority = 10

// Redirect steers the DNS of the given pod IPs (UDP and TCP to port 53,
// any destination) to the proxy's port with TPROXY in the node's network
// namespace: the rules of Chain in the mangle table (iptables-nft,
// written with iptables-restore), and the policy routing that delivers
// the marked packets locally (`ip rule fwmark MARK/MARK lookup TABLE`,
// `local 0.0.0.0/0 dev lo table TABLE`, and IPv6's). A family with no pod
// has none of them. It works in the network namespace of the thread that
// calls it (the commands it runs inherit it).
type Redirect struct {
	port  uint16
	mark  uint32
	table int
	log   *slog.Logger
	mu    sync.Mutex
}

// NewRedirect is the redirect to the proxy's port with the fwmark mark
// and the routing table table. It installs nothing before Sync.
func NewRedirect(port uint16, mark uint32, table int, log *slog.Logger) *Redirect {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Redirect{port: port, mark: mark, table: table, log: log}
}

// Sync makes the kernel redirect the DNS of exactly pods (the desired set;
// others' rules are removed). It is idempotent: what is in place already
// is not written again. A family's rules are replaced in one commit, so a
// packet meets either the old set or the new one.
func (r *Redirect) Sync(pods []netip.Addr) error {
	if r.port == 0 || r.mark == 0 || r.table <= 0 {
		return fmt.Errorf("dns redirect: port %d, mark %#x, table %d: none may be 0", r.port, r.mark, r.table)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, f := range families() {
		var mine []netip.Addr
		for _, p := range pods {
			if p = p.Unmap(); p.IsValid() && p.Is6() == f.v6 {
				mine = append(mine, p)
			}
		}
		slices.SortFunc(mine, netip.Addr.Compare)
		mine = slices.Compact(mine)
		var err error
		if len(mine) == 0 {
			err = r.remove(f)
		} else {
			err = r.install(f, mine)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("dns redirect (%s): %w", f.name, err))
		}
	}
	return errors.Join(errs...)
}

// Close removes everything the redirect installs, found by what it is
// (Chain, the jumps to it, the rule of the mark and table, the local
// route of the table), so it also cleans up after an earlier process.
func (r *Redirect) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, f := range families() {
		if err := r.remove(f); err != nil {
			errs = append(errs, fmt.Errorf("dns redirect (%s): %w", f.name, err))
		}
	}
	return errors.Join(errs...)
}

// install puts the routing in place first, so a packet marked by the
// new rules is delivered locally from the start.
func (r *Redirect) install(f family, pods []netip.Addr) error {
	if err := r.ensureRouting(f); err != nil {
		return err
	}
	s, err := listMangle(f)
	if err != nil {
		return err
	}
	rules := chainRules(f, pods, r.port, r.mark)
	if s.inPlace(rules) {
		return nil
	}
	if err := restore(f, syncScript(s, rules)); err != nil {
		return err
	}
	r.log.Info("DNS redirect rules written", "family", f.name, "pods", len(pods), "port", r.port)
	return nil
}

// remove takes the rules out first, then the routing. Without the
// family's iptables tool (a node with no ip6tables) nothing of it can have
// been installed.
func (r *Redirect) remove(f family) error {
	if _, err := exec.LookPath(f.iptables); err != nil {
		return nil
	}
	s, err := listMangle(f)
	if err != nil {
		return err
	}
	if script := removeScript(s); script != "" {
		if err := restore(f, script); err != nil {
			return err
		}
		r.log.Info("DNS redirect rules removed", "family", f.name)
	}
	return r.removeRouting(f)
}

func listMangle(f family) (mangleState, error) {
	out, err := run(f.iptables, nil, "-w", "-t", "mangle", "-S")
	if err != nil {
		return mangleState{}, err
	}
	return parseMangle(out), nil
}

func restore(f family, script string) error {
	_, err := run(f.restore, strings.NewReader(script), "-w", "--noflush")
	if err != nil {
		return fmt.Errorf("%w; input:\n%s", err, script)
	}
	return nil
}

// run runs a command and returns its output, or an error with what it
// said on stderr.
func run(name string, stdin *strings.Reader, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// rule is the redirect's ip rule of a family.
func (r *Redirect) rule(f family) *netlink.Rule {
	rule := netlink.NewRule()
	rule.Family = f.nl
	rule.Priority = RulePriority
	rule.Mark = r.mark
	mask := r.mark
	rule.Mask = &mask
	rule.Table = r.table
	return rule
}

// localRoute is the route that makes every marked packet local.
func (r *Redirect) localRoute(f family) (*netlink.Route, error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("lo: %w", err)
	}
	all := f.all
	return &netlink.Route{
		Family:    f.nl,
		Dst:       &net.IPNet{IP: all.Addr().AsSlice(), Mask: net.CIDRMask(0, all.Addr().BitLen())},
		Type:      unix.RTN_LOCAL,
		Scope:     unix.RT_SCOPE_HOST,
		Table:     r.table,
		LinkIndex: lo.Attrs().Index,
	}, nil
}

// ensureRouting adds the route and the rule, each idempotently (written
// without listing: only cells/kernel and the writers' dumps list over
// netlink).
func (r *Redirect) ensureRouting(f family) error {
	route, err := r.localRoute(f)
	if err != nil {
		return err
	}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("route local %s dev lo table %d: %w", f.all, r.table, err)
	}
	if err := netlink.RuleAdd(r.rule(f)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ip rule fwmark %#x/%#x lookup %d: %w", r.mark, r.mark, r.table, err)
	}
	return nil
}

// removeRouting deletes the rule (every copy of it) and the route.
func (r *Redirect) removeRouting(f family) error {
	var errs []error
	for range 16 {
		err := netlink.RuleDel(r.rule(f))
		if errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("delete ip rule fwmark %#x/%#x lookup %d: %w", r.mark, r.mark, r.table, err))
			break
		}
	}
	route, err := r.localRoute(f)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := netlink.RouteDel(route); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("delete route local %s table %d: %w", f.all, r.table, err))
	}
	return errors.Join(errs...)
}
