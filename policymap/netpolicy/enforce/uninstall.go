package enforce

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/nldump"
)

// Uninstall takes every program of enimasq off the devices of the calling
// thread's network namespace, with no agent running (enimasq-dbg cleanup):
// the tcx links pinned in linksDir are detached and unpinned, and the tc
// filters named enimasq-policy are deleted from every link. Other
// writers' programs and filters stay, and so do the clsact qdiscs (another
// writer's filters may hang on one enimasq added). It returns what it
// removed, one line each; a second call finds nothing.
func Uninstall(linksDir string) ([]string, error) {
	var removed []string
	var errs []error
	entries, err := os.ReadDir(linksDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		path := filepath.Join(linksDir, e.Name())
		what, err := unpinLink(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, what)
	}
	if err := os.Remove(linksDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove %s: %w", linksDir, err))
	}
	links, err := nldump.Links()
	if err != nil {
		return removed, errors.Join(append(errs, fmt.Errorf("ip link list: %w", err))...)
	}
	for _, l := range links {
		for _, h := range hooks {
			// No clsact qdisc: an empty list. An error is one, not "no
			// filters" (a filter of enimasq's would stay, reported gone).
			filters, err := listFilters(l, h.parent)
			if linkGone(err) {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("tc filter show dev %s %s: %w", l.Attrs().Name, h.name, err))
				continue
			}
			for _, f := range filters {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok || bf.Name != tcFilterName || bf.Handle == 0 {
					continue
				}
				if err := netlink.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("tc filter del dev %s %s: %w", l.Attrs().Name, h.name, err))
					continue
				}
				removed = append(removed, fmt.Sprintf("tc filter %s (pref %#x) on the %s of %s", tcFilterName, bf.Priority, h.name, l.Attrs().Name))
			}
		}
	}
	return removed, errors.Join(errs...)
}

// unpinLink detaches the tcx link pinned at path and removes the pin. A
// pin that is not a link (or a link gone) is removed as well.
func unpinLink(path string) (string, error) {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("remove %s: %w", path, err)
		}
		return "pin " + path, nil
	}
	defer l.Close()
	what := "pin " + path
	if info, err := l.Info(); err == nil {
		what = fmt.Sprintf("link %d (program %d) pinned at %s", info.ID, info.Program, path)
		if tcx := info.TCX(); tcx != nil && tcx.Ifindex != 0 {
			if err := l.Detach(); err != nil {
				return "", fmt.Errorf("detach the link pinned at %s: %w", path, err)
			}
			what = fmt.Sprintf("link %d (program %d, ifindex %d) pinned at %s", info.ID, info.Program, tcx.Ifindex, path)
		}
	}
	if err := l.Unpin(); err != nil {
		return "", fmt.Errorf("unpin %s: %w", path, err)
	}
	return what, nil
}
