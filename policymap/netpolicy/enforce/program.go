package enforce

import (
	"context"
	"errors"
	"fmt"
	stdmaps "maps"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// programs holds the loaded policy programs, bound to the policy maps as
// they are and to the pinned state maps (tracked connections, mode). They
// are loaded again when a policy map is replaced (another ID).
type programs struct {
	settings Settings
	maps     PolicyMaps

	mu     sync.Mutex
	loaded boundPrograms
	state  map[string]*ebpf.Map // by name: policybpf.PolicyStateMapNames
}

// get returns the programs for the current policy maps.
func (p *programs) get(ctx context.Context) (*policybpf.PolicyProgram, error) {
	maps, err := p.maps(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// The old programs stay in the kernel while a link holds them; the
	// links are moved to the new ones as their rows are reconciled.
	return p.loaded.bind(maps, func() (map[string]*ebpf.Map, error) {
		if p.state == nil {
			if p.state, err = p.openState(); err != nil {
				return nil, err
			}
		}
		return stdmaps.Clone(p.state), nil
	})
}

// boundPrograms is the policy programs loaded bound to a set of policy
// maps (the programs of the pods' devices and the verdict API's alike).
type boundPrograms struct {
	prog *policybpf.PolicyProgram
	ids  map[string]ebpf.MapID
}

// bind returns the programs bound to the policy maps and to the state maps
// state returns, loaded again (the old ones closed) only when a policy map has
// another ID than when they were loaded; state is asked only then.
func (b *boundPrograms) bind(policy map[string]*ebpf.Map, state func() (map[string]*ebpf.Map, error)) (*policybpf.PolicyProgram, error) {
	ids := map[string]ebpf.MapID{}
	for name, m := range policy {
		info, err := m.Info()
		if err != nil {
			return nil, fmt.Errorf("map %s: %w", name, err)
		}
		ids[name], _ = info.ID()
	}
	if b.prog != nil && sameIDs(b.ids, ids) {
		return b.prog, nil
	}
	st, err := state()
	if err != nil {
		return nil, err
	}
	all := stdmaps.Clone(st)
	for name, m := range policy {
		all[name] = m
	}
	prog, err := policybpf.LoadPolicyProgram(all)
	if err != nil {
		return nil, err
	}
	b.close()
	b.prog, b.ids = prog, ids
	return prog, nil
}

func (b *boundPrograms) close() {
	if b.prog != nil {
		b.prog.Close()
		b.prog = nil
	}
}

// openState opens the pinned state maps (policybpf.PolicyStateMapNames: made
// and pinned the first time, kept across restarts) and writes the mode.
func (p *programs) openState() (map[string]*ebpf.Map, error) {
	if err := os.MkdirAll(p.settings.GlobalsDir, 0o700); err != nil {
		return nil, err
	}
	out := map[string]*ebpf.Map{}
	closeAll := func() {
		for _, o := range out {
			o.Close()
		}
	}
	for _, name := range policybpf.PolicyStateMapNames() {
		spec, err := policybpf.PolicyStateSpec(name)
		if err != nil {
			closeAll()
			return nil, err
		}
		if name == policybpf.PolicyCTMapName && p.settings.ConntrackMax > 0 {
			// Another size than the pinned map's is another map: the
			// pin is replaced (ErrMapIncompatible below), its
			// connections lost.
			spec.MaxEntries = p.settings.ConntrackMax
		}
		spec.Pinning = ebpf.PinByName
		m, err := ebpf.NewMapWithOptions(spec, ebpf.MapOptions{PinPath: p.settings.GlobalsDir})
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			// Another layout (an older agent's): start afresh.
			os.Remove(filepath.Join(p.settings.GlobalsDir, spec.Name))
			m, err = ebpf.NewMapWithOptions(spec, ebpf.MapOptions{PinPath: p.settings.GlobalsDir})
		}
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("map %s pinned in %s: %w", spec.Name, p.settings.GlobalsDir, err)
		}
		out[name] = m
	}
	mode := p.settings.Mode
	if p.settings.Events {
		mode |= policybpf.PolicyModeEvents
	}
	if p.settings.Audit {
		mode |= policybpf.PolicyModeAudit
	}
	if err := policybpf.SetPolicyMode(out[policybpf.PolicyModeMapName], mode); err != nil {
		closeAll()
		return nil, err
	}
	return out, nil
}

// start opens the state maps and writes the mode at once, so that the
// programs an earlier run left attached follow this run's mode before
// anything is reconciled; a failure is retried by the first get.
func (p *programs) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != nil {
		return nil
	}
	state, err := p.openState()
	if err != nil {
		return err
	}
	p.state = state
	return nil
}

func (p *programs) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.loaded.close()
	for _, m := range p.state {
		m.Close()
	}
}

func sameIDs(a, b map[string]ebpf.MapID) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// pods is the map of the devices' pods, once the state is open.
func (p *programs) pods() (*ebpf.Map, error) { return p.stateMap(policybpf.PolicyPodsMapName) }

// stateMap is a state map (policybpf.PolicyStateMapNames), once the state is
// open: the verdict counters and events are read from theirs.
func (p *programs) stateMap(name string) (*ebpf.Map, error) {
	if err := p.start(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.state[name]
	if !ok {
		return nil, fmt.Errorf("no policy state map %s", name)
	}
	return m, nil
}
