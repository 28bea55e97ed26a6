package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/bpf"
)

// progsReport is what `bpf progs` prints: the links pinned under
// <bpf-root>/enimasq/links, the programs they hold and the maps those
// use, with their kernel IDs (bpftool's), as the AWS network policy agent's
// `loaded-ebpfdata`; and the maps pinned in the globals dir.
type progsReport struct {
	Links    []linkInfo `json:"links"`
	Programs []progInfo `json:"programs"`
	Maps     []mapInfo  `json:"maps"`
}

type linkInfo struct {
	Pin       string `json:"pin"`
	ID        uint32 `json:"id"`
	Type      string `json:"type"`
	Ifindex   uint32 `json:"ifindex,omitempty"`
	Device    string `json:"device,omitempty"`
	Attach    string `json:"attach,omitempty"`
	ProgramID uint32 `json:"programID"`
	Error     string `json:"error,omitempty"`
}

type progInfo struct {
	ID     uint32   `json:"id"`
	Name   string   `json:"name"`
	Type   string   `json:"type"`
	Tag    string   `json:"tag"`
	Loaded string   `json:"loaded,omitempty"`
	MapIDs []uint32 `json:"mapIDs"`
	Error  string   `json:"error,omitempty"`
}

type mapInfo struct {
	ID         uint32 `json:"id"`
	Name       string `json:"name"`
	Type       string `json:"type"`
	MaxEntries uint32 `json:"maxEntries"`
	Pin        string `json:"pin,omitempty"`
}

func bpfProgsCommand(o *options) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "progs",
		Short: "List the policy programs' tcx links (pinned under <bpf-root>/enimasq/links), their programs and maps, with IDs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := loadedPrograms(o, bpfRootOf(o))
			if err != nil {
				return err
			}
			if format != "" {
				return printAs(cmd.OutOrStdout(), format, rep)
			}
			return writeProgs(cmd.OutOrStdout(), rep)
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

func writeProgs(w interface{ Write([]byte) (int, error) }, rep progsReport) error {
	t := newTable(w, "LINK", "TYPE", "DEVICE", "IFINDEX", "ATTACH", "PROG", "PIN")
	for _, l := range rep.Links {
		if l.Error != "" {
			t.row("-", "-", "-", "-", "-", "-", l.Pin+": "+l.Error)
			continue
		}
		t.row(strconv.Itoa(int(l.ID)), l.Type, orDash(l.Device), strconv.Itoa(int(l.Ifindex)), orDash(l.Attach),
			strconv.Itoa(int(l.ProgramID)), l.Pin)
	}
	t.flush()
	fmt.Fprintln(w)
	t = newTable(w, "PROG", "NAME", "TYPE", "TAG", "LOADED", "MAPS")
	for _, p := range rep.Programs {
		if p.Error != "" {
			t.row(strconv.Itoa(int(p.ID)), "-", "-", "-", "-", p.Error)
			continue
		}
		ids := make([]string, len(p.MapIDs))
		for i, id := range p.MapIDs {
			ids[i] = strconv.Itoa(int(id))
		}
		t.row(strconv.Itoa(int(p.ID)), p.Name, p.Type, p.Tag, orDash(p.Loaded), strings.Join(ids, ","))
	}
	t.flush()
	fmt.Fprintln(w)
	t = newTable(w, "MAP", "NAME", "TYPE", "MAX ENTRIES", "PIN")
	for _, m := range rep.Maps {
		t.row(strconv.Itoa(int(m.ID)), m.Name, m.Type, strconv.Itoa(int(m.MaxEntries)), orDash(m.Pin))
	}
	return t.flush()
}

// loadedPrograms reads the pinned links, their programs, the maps of those
// and the pinned maps of the globals dir.
func loadedPrograms(o *options, root string) (progsReport, error) {
	rep := progsReport{Links: []linkInfo{}, Programs: []progInfo{}, Maps: []mapInfo{}}
	dir := filepath.Join(root, "enimasq", "links")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return rep, err
	}
	names := deviceNames(o)
	var progIDs []ebpf.ProgramID
	for _, e := range entries {
		li := linkInfo{Pin: filepath.Join(dir, e.Name())}
		l, err := link.LoadPinnedLink(li.Pin, nil) // links take no read-only flag
		if err != nil {
			li.Error = err.Error()
			rep.Links = append(rep.Links, li)
			continue
		}
		info, err := l.Info()
		l.Close() // the pin keeps it
		if err != nil {
			li.Error = err.Error()
			rep.Links = append(rep.Links, li)
			continue
		}
		li.ID, li.Type, li.ProgramID = uint32(info.ID), fmt.Sprint(info.Type), uint32(info.Program)
		if tcx := info.TCX(); tcx != nil {
			li.Type = "tcx"
			li.Ifindex, li.Attach = tcx.Ifindex, ebpf.AttachType(tcx.AttachType).String()
			li.Device = names(tcx.Ifindex)
		}
		rep.Links = append(rep.Links, li)
		if !slices.Contains(progIDs, info.Program) {
			progIDs = append(progIDs, info.Program)
		}
	}
	slices.Sort(progIDs)
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	var mapIDs []ebpf.MapID
	for _, id := range progIDs {
		pi := progInfo{ID: uint32(id), MapIDs: []uint32{}}
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			pi.Error = err.Error()
			rep.Programs = append(rep.Programs, pi)
			continue
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			pi.Error = err.Error()
			rep.Programs = append(rep.Programs, pi)
			continue
		}
		pi.Name, pi.Type, pi.Tag = info.Name, info.Type.String(), info.Tag
		if at, ok := info.LoadTime(); ok {
			pi.Loaded = (time.Duration(ts.Nano()) - at).Round(time.Second).String() + " ago"
		}
		ids, _ := info.MapIDs()
		for _, m := range ids {
			pi.MapIDs = append(pi.MapIDs, uint32(m))
			if !slices.Contains(mapIDs, m) {
				mapIDs = append(mapIDs, m)
			}
		}
		rep.Programs = append(rep.Programs, pi)
	}
	// The pinned maps, and the programs' maps that are not pinned (the
	// placeholders of a family the node does not run).
	pinned := map[ebpf.MapID]bool{}
	globals := bpf.GlobalsDir(root)
	files, _ := os.ReadDir(globals)
	for _, f := range files {
		if !strings.HasPrefix(f.Name(), "enimasq_") && !strings.HasPrefix(f.Name(), "cilium_ipmasq_") {
			continue
		}
		path := filepath.Join(globals, f.Name())
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue
		}
		if mi, ok := describeMap(m); ok {
			// The kernel keeps 15 bytes of a name; the pin has it whole.
			mi.Name, mi.Pin = f.Name(), path
			pinned[ebpf.MapID(mi.ID)] = true
			rep.Maps = append(rep.Maps, mi)
		}
		m.Close()
	}
	for _, id := range mapIDs {
		if pinned[id] {
			continue
		}
		if m, err := ebpf.NewMapFromID(id); err == nil {
			if mi, ok := describeMap(m); ok {
				rep.Maps = append(rep.Maps, mi)
			}
			m.Close()
		}
	}
	slices.SortFunc(rep.Maps, func(a, b mapInfo) int { return int(a.ID) - int(b.ID) })
	return rep, nil
}

func describeMap(m *ebpf.Map) (mapInfo, bool) {
	info, err := m.Info()
	if err != nil {
		return mapInfo{}, false
	}
	id, _ := info.ID()
	return mapInfo{ID: uint32(id), Name: info.Name, Type: info.Type.String(), MaxEntries: info.MaxEntries}, true
}
