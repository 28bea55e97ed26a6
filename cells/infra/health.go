package infra

import (
	"cmp"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
)

// HealthRegistry is the agent's cell.Health: a tree of scopes, one per module
// (given to each module by a module decorator) and below it one per job or
// reconciler. A module is as healthy as its least healthy scope.
type HealthRegistry struct {
	mu      sync.Mutex
	scopes  map[string]*healthScope
	root    *healthScope
	changed chan struct{} // closed and replaced on every update
}

type healthScope struct {
	reg     *HealthRegistry
	name    string
	level   cell.Level
	message string
	err     error
}

// NewHealthRegistry returns an empty registry. Its root scope is the
// cell.Health of code outside any module.
func NewHealthRegistry() *HealthRegistry {
	r := &HealthRegistry{scopes: map[string]*healthScope{}, changed: make(chan struct{})}
	r.root = &healthScope{reg: r, level: cell.StatusUnknown}
	return r
}

// Root is the unscoped cell.Health.
func (r *HealthRegistry) Root() cell.Health { return r.root }

func (s *healthScope) set(level cell.Level, message string, err error) {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	s.level, s.message, s.err = level, message, err
	close(s.reg.changed)
	s.reg.changed = make(chan struct{})
}

// Changed returns a channel that is closed at the next health update.
func (r *HealthRegistry) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

func (s *healthScope) OK(status string)                  { s.set(cell.StatusOK, status, nil) }
func (s *healthScope) Stopped(reason string)             { s.set(cell.StatusStopped, reason, nil) }
func (s *healthScope) Degraded(reason string, err error) { s.set(cell.StatusDegraded, reason, err) }

func (s *healthScope) NewScope(name string) cell.Health {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	full := name
	if s.name != "" {
		full = s.name + "." + name
	}
	if existing, ok := s.reg.scopes[full]; ok {
		return existing
	}
	child := &healthScope{reg: s.reg, name: full, level: cell.StatusUnknown}
	s.reg.scopes[full] = child
	return child
}

func (s *healthScope) Close() {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	delete(s.reg.scopes, s.name)
}

// ScopeStatus is the health of one scope.
type ScopeStatus struct {
	Scope   string `json:"scope"`
	Level   string `json:"level"`
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
}

// ModuleStatus is the health of one module: the worst level of its scopes,
// and the scopes that are degraded.
type ModuleStatus struct {
	Module   string        `json:"module"`
	Level    string        `json:"level"`
	Degraded []ScopeStatus `json:"degraded,omitempty"`
}

// Report is what /healthz serves.
type Report struct {
	OK      bool           `json:"ok"`
	Modules []ModuleStatus `json:"modules"`
}

var levelRank = map[cell.Level]int{
	cell.StatusOK: 0, cell.StatusStopped: 1, cell.StatusUnknown: 2, cell.StatusDegraded: 3,
}

// Scopes returns every scope, sorted by name.
func (r *HealthRegistry) Scopes() []ScopeStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ScopeStatus, 0, len(r.scopes))
	for _, s := range r.scopes {
		st := ScopeStatus{Scope: s.name, Level: string(s.level), Message: s.message}
		if s.err != nil {
			st.Error = s.err.Error()
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b ScopeStatus) int { return cmp.Compare(a.Scope, b.Scope) })
	return out
}

// Report summarizes health by module. It is OK when no module is degraded.
func (r *HealthRegistry) Report() Report {
	rep := Report{OK: true, Modules: []ModuleStatus{}}
	scopes := r.Scopes() // sorted: a module's scopes are adjacent
	for i, s := range scopes {
		module, _, _ := strings.Cut(s.Scope, ".")
		// A scope that only holds others (a module's own scope, given to it
		// by the module decorator) and never reported is not "Unknown".
		parentOnly := cell.Level(s.Level) == cell.StatusUnknown && s.Message == "" &&
			i+1 < len(scopes) && strings.HasPrefix(scopes[i+1].Scope, s.Scope+".")
		if n := len(rep.Modules); n == 0 || rep.Modules[n-1].Module != module {
			rep.Modules = append(rep.Modules, ModuleStatus{Module: module, Level: string(cell.StatusOK)})
		}
		m := &rep.Modules[len(rep.Modules)-1]
		if parentOnly {
			continue
		}
		if levelRank[cell.Level(s.Level)] > levelRank[cell.Level(m.Level)] {
			m.Level = s.Level
		}
		if cell.Level(s.Level) == cell.StatusDegraded {
			m.Degraded = append(m.Degraded, s)
			rep.OK = false
		}
	}
	return rep
}

func (r *HealthRegistry) lines() []string {
	var b strings.Builder
	r.WriteText(&b)
	return strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
}

// WriteText prints one line per scope, the way `health` in the shell shows it.
func (r *HealthRegistry) WriteText(w io.Writer) {
	for _, s := range r.Scopes() {
		fmt.Fprintf(w, "%s: level=%s message=%s", s.Scope, s.Level, s.Message)
		if s.Error != "" && !strings.HasSuffix(s.Message, s.Error) {
			fmt.Fprintf(w, " error=%s", s.Error)
		}
		fmt.Fprintln(w)
	}
}

// healthCommand is the `health` shell and script command: without arguments
// it prints every scope; with a pattern it waits until a scope line contains
// it as a regular expression (script tests use it to wait for Degraded or OK).
func healthCommand(r *HealthRegistry) hive.ScriptCmdOut {
	return hive.NewScriptCmd("health", script.Command(
		script.CmdUsage{Summary: "Show module health, or wait for a line containing a pattern", Args: "[pattern]"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) == 0 {
				r.WriteText(s.LogWriter())
				return nil, nil
			}
			re, err := regexp.Compile(strings.Join(args, " "))
			if err != nil {
				return nil, err
			}
			return nil, waitHealth(s, r, re)
		}))
}

func waitHealth(s *script.State, r *HealthRegistry, pattern *regexp.Regexp) error {
	for {
		changed := r.Changed()
		for _, line := range r.lines() {
			if pattern.MatchString(line) {
				s.Logf("matched: %s\n", line)
				return nil
			}
		}
		select {
		case <-changed:
		case <-s.Context().Done():
			return fmt.Errorf("no health line matches %q", pattern)
		}
	}
}
