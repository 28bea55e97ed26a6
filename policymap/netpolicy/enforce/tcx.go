package enforce

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

func (o *ops) pinPath(device string, h hook) string {
	return filepath.Join(o.settings.LinksDir, device+"_"+h.name)
}

// attachTCX keeps a tcx link of prog on the hook, pinned: the pinned link,
// if it is still attached to this ifindex, is moved to prog; else (the
// device made again, the link detached by hand) it is replaced.
func (o *ops) attachTCX(a *Attachment, h hook, prog *ebpf.Program) error {
	path := o.pinPath(a.Device, h)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		ok, err := o.attachedTCX(l, a, h, prog)
		if ok || err != nil {
			l.Close()
			return err
		}
		l.Unpin()
		l.Close()
		o.log.Info("Policy program no longer on the pod's device (detached, or the device made again): attaching it again",
			"device", a.Device, "ifindex", a.Ifindex, "side", h.name)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: a.Ifindex, Program: prog, Attach: h.tcx})
	if err != nil {
		return err
	}
	defer l.Close()
	if err := os.MkdirAll(o.settings.LinksDir, 0o700); err != nil {
		return err
	}
	os.Remove(path)
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin the link at %s: %w", path, err)
	}
	return nil
}

// attachedTCX says whether the pinned link l is attached to the device's
// hook, moving it to prog if it holds another program.
func (o *ops) attachedTCX(l link.Link, a *Attachment, h hook, prog *ebpf.Program) (bool, error) {
	info, err := l.Info()
	if err != nil {
		return false, nil
	}
	tcx := info.TCX()
	if tcx == nil || int(tcx.Ifindex) != a.Ifindex || ebpf.AttachType(tcx.AttachType) != h.tcx {
		return false, nil
	}
	pinfo, err := prog.Info()
	if err != nil {
		return false, err
	}
	if id, _ := pinfo.ID(); id == info.Program {
		return true, nil
	}
	if err := l.Update(prog); err != nil {
		return false, fmt.Errorf("move the link to the new program: %w", err)
	}
	return true, nil
}

// detach removes the pin of the device's link: the link, held by nothing
// else, goes and detaches.
func (o *ops) detach(device string, h hook) error {
	if err := os.Remove(o.pinPath(device, h)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("detach from the %s of %s: %w", h.name, device, err)
	}
	return nil
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// pruneLinks removes enimasq's links (pins) of the devices desired is
// false for.
func (o *ops) pruneLinks(desired map[string]bool) error {
	entries, err := os.ReadDir(o.settings.LinksDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var errs []error
	for _, e := range entries {
		device, side, ok := cutLast(e.Name(), "_")
		if !ok || desired[device] {
			continue
		}
		for _, h := range hooks {
			if h.name == side {
				errs = append(errs, o.detach(device, h))
			}
		}
	}
	return errors.Join(errs...)
}
