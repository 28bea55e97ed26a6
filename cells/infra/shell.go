package infra

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sort"
	"sync"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/shell"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// ShellConfig is the hive shell's socket and what it offers.
type ShellConfig struct {
	ShellSockPath    string `mapstructure:"shell-sock-path"`
	EnableDebugShell bool   `mapstructure:"enable-debug-shell"`
}

// EnableDebugShellFlag offers the shell's commands that change the agent.
const EnableDebugShellFlag = "enable-debug-shell"

func (def ShellConfig) Flags(flags *pflag.FlagSet) {
	flags.String(shell.ShellSockPathName, def.ShellSockPath, "Path to the shell UNIX socket")
	flags.Bool(EnableDebugShellFlag, def.EnableDebugShell,
		"Offer the shell's commands that change the agent or touch its files (db/insert, db/delete, fault injection, exec, cat, *-cmp, ipam/allocate, db/show -o); off: read commands only")
}

// ReadOnlyShellCommands are the commands the shell offers without
// --enable-debug-shell: they read tables, health, metrics and the kernel
// objects, and change nothing. Every other command (a new one too) is a
// debug command. The statedb commands among them refuse -o (a file written
// on the agent's side).
var ReadOnlyShellCommands = []string{
	"help", "health", "metrics",
	"db", "db/show", "db/get", "db/prefix", "db/list", "db/lowerbound", "db/initialized", "db/watch", "db/dump",
	"policymap/ipmasq-list", "policymap/masq-decide",
	"policymap/policy-list", "policymap/policy-verdict", // not policy-verdicts: it reads a file on the agent side
	"ipam/rules", "ipam/routes",
}

// ShellCommands are the commands the shell offers: all of them (and hive
// shell's exec and cat) with debug, else the read-only ones.
func ShellCommands(all map[string]script.Cmd, debug bool) map[string]script.Cmd {
	defaults := script.DefaultCmds()
	cmds := map[string]script.Cmd{"help": defaults["help"]}
	if debug {
		for name, cmd := range all {
			cmds[name] = cmd
		}
		cmds["exec"], cmds["cat"] = defaults["exec"], defaults["cat"]
		return cmds
	}
	for _, name := range ReadOnlyShellCommands {
		if cmd, ok := all[name]; ok {
			cmds[name] = noAgentFiles{cmd}
		}
	}
	return cmds
}

// noAgentFiles refuses -o (--out): the file would be written by the agent,
// as root, wherever the caller names.
type noAgentFiles struct{ script.Cmd }

func (c noAgentFiles) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	if s.Flags != nil {
		if f := s.Flags.Lookup("out"); f != nil && f.Changed {
			return nil, fmt.Errorf("-o writes the file on the agent's side: refused without --%s; redirect enimasq-dbg's output instead", EnableDebugShellFlag)
		}
	}
	return c.Cmd.Run(s, args...)
}

type shellParams struct {
	cell.In

	Cmds      hive.ScriptCmds
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Health    cell.Health
	Config    ShellConfig
	Node      nodeconfig.Config
}

// shellCell is the hive shell server on <state-dir>/shell.sock (or
// --shell-sock-path), speaking hive's shell protocol, so that `enimasq-dbg
// shell` and hive's shell client talk to it. Unlike hive's server it offers
// only read commands unless --enable-debug-shell, and runs its connections
// outside the job registry: a call logs nothing at INFO.
var shellCell = cell.Module(
	"shell",
	"Hive debug shell",

	cell.Config(ShellConfig{}),
	cell.Invoke(registerShell),
)

func registerShell(p shellParams) {
	path := SocketPath(p.Config.ShellSockPath, p.Node.StateDir, "shell.sock")
	names := make([]string, 0)
	cmds := ShellCommands(p.Cmds.Map(), p.Config.EnableDebugShell)
	for name := range cmds {
		names = append(names, name)
	}
	sort.Strings(names)
	sh := &shellServer{log: p.Log, engine: &script.Engine{Cmds: cmds}}
	ctx, cancel := context.WithCancel(context.Background())
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			l, err := ListenUnix(path)
			if err != nil {
				return fmt.Errorf("--shell-sock-path %s: %w", path, err)
			}
			p.Log.Info("Shell listening", "socket", path, "debug", p.Config.EnableDebugShell)
			p.Log.Debug("Shell commands", "commands", names)
			p.Health.OK("Listening on " + path)
			sh.wg.Add(1)
			go sh.serve(ctx, l)
			return nil
		},
		OnStop: func(cell.HookContext) error {
			cancel()
			sh.wg.Wait()
			return nil
		},
	})
}

type shellServer struct {
	log    *slog.Logger
	engine *script.Engine
	wg     sync.WaitGroup
}

func (sh *shellServer) serve(ctx context.Context, l net.Listener) {
	defer sh.wg.Done()
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for id := 0; ; id++ {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil {
				sh.log.Error("Shell accept failed", "error", err)
			}
			return
		}
		sh.wg.Add(1)
		go func() {
			defer sh.wg.Done()
			sh.handle(ctx, id, conn)
		}()
	}
}

// The markers of hive's shell protocol (hive/shell's const.go).
const (
	endMarker   = "<<end>>"
	errorMarker = "<<error>>"
)

// handle runs one client's lines, as hive's shell server does.
func (sh *shellServer) handle(ctx context.Context, id int, conn net.Conn) {
	sh.log.Debug("Shell client connected", "id", id)
	defer sh.log.Debug("Shell client disconnected", "id", id)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		conn.Close()
	}()
	defer func() {
		if err := recover(); err != nil {
			stack := make([]byte, 4096)
			stack = stack[:runtime.Stack(stack, false)]
			sh.log.Error("Panic in a shell command", "error", err, "stacktrace", string(stack))
			fmt.Fprintf(conn, "PANIC: %s\n%s\n%s\n", err, stack, endMarker)
		}
	}()
	s, err := script.NewState(ctx, "/tmp", nil)
	if err != nil {
		sh.log.Error("Shell state", "error", err)
		return
	}
	w := cancelOnError{conn, cancel}
	bio := bufio.NewReader(conn)
	for {
		line, _, err := bio.ReadLine()
		if err != nil {
			return
		}
		switch string(line) {
		case "stop", "exit", "quit":
			return
		}
		if err := sh.engine.ExecuteLine(s, string(line), w); err != nil {
			_, err = fmt.Fprintf(w, "%s%s\n", err, errorMarker)
			if err != nil {
				return
			}
		} else if _, err := fmt.Fprintln(w, endMarker); err != nil {
			return
		}
	}
}

// cancelOnError cancels the running command when the client goes away.
type cancelOnError struct {
	w      io.Writer
	cancel context.CancelFunc
}

func (c cancelOnError) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	if err != nil {
		c.cancel()
	}
	return n, err
}
