package infra

import (
	"bytes"
	"context"
	"errors"
	"expvar"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// APIConfig is the agent API's socket and its timeouts.
type APIConfig struct {
	APISockPath    string        `mapstructure:"api-sock-path"`
	APIReadTimeout time.Duration `mapstructure:"api-read-timeout"`
	APIIdleTimeout time.Duration `mapstructure:"api-idle-timeout"`
}

// DefaultAPIConfig: a request (at most 1 MiB, on a local socket) is read in
// well under a second; ten are left to a loaded node.
var DefaultAPIConfig = APIConfig{APIReadTimeout: 10 * time.Second, APIIdleTimeout: time.Minute}

func (def APIConfig) Flags(flags *pflag.FlagSet) {
	flags.String("api-sock-path", def.APISockPath, "Agent API unix socket (default <state-dir>/enimasq.sock)")
	flags.Duration("api-read-timeout", def.APIReadTimeout, "Close an API connection whose request (headers and body) is not read in this time")
	flags.Duration("api-idle-timeout", def.APIIdleTimeout, "Close an idle API connection after this time")
}

// timeouts are an HTTP server's: a client that sends its request slowly, or
// keeps a connection open doing nothing, does not hold it for ever.
type timeouts struct{ read, idle time.Duration }

// AgentPaths is GET /v1/config: where the agent keeps what it made.
type AgentPaths struct {
	BPFRoot     string `json:"bpfRoot"`
	GlobalsDir  string `json:"globalsDir"`
	StateDir    string `json:"stateDir"`
	APISocket   string `json:"apiSocket"`
	ShellSocket string `json:"shellSocket"`
}

// APIHandler is an endpoint a feature cell adds to the agent API.
// Pattern is a net/http ServeMux pattern, e.g. "POST /v1/ipam".
type APIHandler struct {
	Pattern string
	Handler http.Handler
}

// APIHandlerOut adds an APIHandler to the agent API.
type APIHandlerOut struct {
	cell.Out
	Handler APIHandler `group:"api-handlers"`
}

type apiParams struct {
	cell.In

	Lifecycle  cell.Lifecycle
	Log        *slog.Logger
	DB         *statedb.DB
	Registry   *HealthRegistry
	Health     cell.Health
	Metrics    *reconciler.ExpVarMetrics
	Prometheus *Registry
	Node       nodeconfig.Config
	Config     APIConfig
	Shell      ShellConfig
	Handlers   []APIHandler `group:"api-handlers"`
}

// SocketPath resolves a socket flag: empty means <state-dir>/<name>.
func SocketPath(flag, stateDir, name string) string {
	if flag != "" {
		return flag
	}
	return filepath.Join(stateDir, name)
}

func newAPIMux(p apiParams) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/statedb/", http.StripPrefix("/statedb", p.DB.HTTPHandler()))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		rep := p.Registry.Report()
		code := http.StatusOK
		if !rep.OK {
			code = http.StatusServiceUnavailable
		}
		agentapi.WriteJSONIndent(w, code, rep)
	})
	mux.HandleFunc("GET /debug/vars", func(w http.ResponseWriter, r *http.Request) {
		// The process-wide expvars plus this hive's reconciler metrics, which
		// are kept unpublished so that several hives can share a process.
		var b bytes.Buffer
		fmt.Fprintf(&b, "{\n%q: %s", "reconciler", p.Metrics.Map().String())
		expvar.Do(func(kv expvar.KeyValue) {
			fmt.Fprintf(&b, ",\n%q: %s", kv.Key, kv.Value)
		})
		fmt.Fprintf(&b, "\n}\n")
		agentapi.WriteBody(w, http.StatusOK, "application/json", b.Bytes())
	})
	mux.Handle("GET /metrics", p.Prometheus.Handler())
	mux.HandleFunc("GET /v1/config", func(w http.ResponseWriter, r *http.Request) {
		// The paths a client (enimasq-dbg) needs to find what this agent
		// made, whatever flags it was started with.
		agentapi.WriteJSON(w, http.StatusOK, AgentPaths{
			BPFRoot:     p.Node.BPFRoot,
			GlobalsDir:  p.Node.GlobalsDir(),
			StateDir:    p.Node.StateDir,
			APISocket:   SocketPath(p.Config.APISockPath, p.Node.StateDir, "enimasq.sock"),
			ShellSocket: SocketPath(p.Shell.ShellSockPath, p.Node.StateDir, "shell.sock"),
		})
	})
	for _, h := range p.Handlers {
		mux.Handle(h.Pattern, h.Handler)
	}
	return mux
}

// ListenUnix listens on a unix socket at path with mode 0600, replacing a
// stale socket file. Callers hold the agent lock, so a socket file present
// here belongs to a dead agent.
func ListenUnix(path string) (net.Listener, error) {
	if err := MkdirPrivate(filepath.Dir(path)); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		os.Remove(path)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func registerAPIServer(p apiParams) error {
	path := SocketPath(p.Config.APISockPath, p.Node.StateDir, "enimasq.sock")
	if p.Config.APIReadTimeout <= 0 || p.Config.APIIdleTimeout <= 0 {
		return fmt.Errorf("--api-read-timeout %s and --api-idle-timeout %s: must be positive", p.Config.APIReadTimeout, p.Config.APIIdleTimeout)
	}
	t := timeouts{read: p.Config.APIReadTimeout, idle: p.Config.APIIdleTimeout}
	serveHTTP(p.Lifecycle, p.Log, p.Health, "agent API", t, newAPIMux(p), func() (net.Listener, error) {
		l, err := ListenUnix(path)
		if err != nil {
			return nil, fmt.Errorf("--api-sock-path %s: %w", path, err)
		}
		return l, nil
	})
	return nil
}

// serveHTTP serves handler from start to stop on the listener listen opens,
// reporting it in health; a stop waits for the requests in flight (until
// the stop deadline).
func serveHTTP(lc cell.Lifecycle, log *slog.Logger, health cell.Health, what string, t timeouts, handler http.Handler, listen func() (net.Listener, error)) {
	server := &http.Server{Handler: handler, ReadHeaderTimeout: min(5*time.Second, t.read), ReadTimeout: t.read, IdleTimeout: t.idle}
	done := make(chan struct{})
	lc.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			l, err := listen()
			if err != nil {
				return err
			}
			log.Info("Serving "+what, "address", l.Addr().String())
			health.OK("Serving " + what + " on " + l.Addr().String())
			go func() {
				defer close(done)
				if err := server.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Error(what+" stopped", "error", err)
				}
			}()
			return nil
		},
		OnStop: func(ctx cell.HookContext) error {
			err := server.Shutdown(ctx)
			if errors.Is(err, context.DeadlineExceeded) {
				err = server.Close()
			}
			<-done
			return err
		},
	})
}

var apiCell = cell.Module(
	"api",
	"Agent API on a unix socket",

	cell.Config(DefaultAPIConfig),
	cell.Invoke(registerAPIServer),
)
