package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"

	"github.com/enimasq/enimasq/cells/agentapi"
)

const defaultStateDir = "/var/run/enimasq"

type options struct {
	stateDir  string
	apiSocket string
	bpfRoot   string
}

func (o *options) socket() string {
	if o.apiSocket != "" {
		return o.apiSocket
	}
	return filepath.Join(o.stateDir, "enimasq.sock")
}

func newRootCommand() *cobra.Command {
	o := &options{}
	root := &cobra.Command{
		Use:           "enimasq-dbg",
		Short:         "Inspect a running enimasq-agent",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// cobra's completion command: enimasq-dbg completion bash|zsh|fish|powershell.
	root.CompletionOptions.HiddenDefaultCmd = false
	root.PersistentFlags().StringVar(&o.stateDir, "state-dir", defaultStateDir, "The agent's state dir (socket paths default into it)")
	root.PersistentFlags().StringVar(&o.apiSocket, "socket", "", "Agent API socket (default <state-dir>/enimasq.sock)")
	root.AddCommand(
		statedbCommand(o),
		healthCommand(o),
		statusCommand(o),
		shellCommand(o),
		bpfCommand(o),
		ipamCommand(o),
		cleanupCommand(o),
		versionCommand(o),
		bugtoolCommand(o),
	)
	root.AddCommand(policyCommands(o)...)
	for _, c := range root.Commands() {
		failUnknownSubcommands(c)
	}
	return root
}

// apiGet fetches path from the agent API. Status codes are returned, not
// turned into errors: /healthz answers 503 with a body.
func apiGet(o *options, path string) (int, []byte, error) {
	return agentapi.NewClient(o.socket(), 10*time.Second).Get(path)
}

func statedbCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "statedb", Short: "Inspect the agent's statedb"}
	cmd.AddCommand(&cobra.Command{
		Use:   "dump [TABLE...]",
		Short: "Dump tables as JSON (all tables without arguments)",
		RunE: func(cmd *cobra.Command, tables []string) error {
			out, err := dumpTables(o, tables)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	})
	return cmd
}

// dumpTables returns {"table": [objects...], ...} for the given tables.
func dumpTables(o *options, tables []string) ([]byte, error) {
	if len(tables) == 0 {
		code, body, err := apiGet(o, "/statedb/dump")
		if err != nil {
			return nil, err
		}
		if code != http.StatusOK {
			return nil, fmt.Errorf("agent answered %d: %s", code, strings.TrimSpace(string(body)))
		}
		return body, nil
	}
	merged := map[string]json.RawMessage{}
	for _, t := range tables {
		code, body, err := apiGet(o, "/statedb/dump/"+url.PathEscape(t))
		if err != nil {
			return nil, err
		}
		if code != http.StatusOK {
			return nil, fmt.Errorf("dump %s: agent answered %d: %s", t, code, strings.TrimSpace(string(body)))
		}
		var one map[string]json.RawMessage
		if err := json.Unmarshal(body, &one); err != nil {
			return nil, fmt.Errorf("dump %s: %w", t, err)
		}
		rows, ok := one[t]
		if !ok {
			return nil, fmt.Errorf("no table %q (enimasq-dbg shell -- db lists them)", t)
		}
		merged[t] = rows
	}
	out, err := json.MarshalIndent(merged, "", "  ")
	return append(out, '\n'), err
}

type healthReport struct {
	OK      bool           `json:"ok"`
	Modules []moduleHealth `json:"modules"`
}

type moduleHealth struct {
	Module   string `json:"module"`
	Level    string `json:"level"`
	Degraded []struct {
		Scope   string `json:"scope"`
		Message string `json:"message"`
		Error   string `json:"error,omitempty"`
	} `json:"degraded,omitempty"`
}

func healthCommand(o *options) *cobra.Command {
	var asJSON bool
	var format string
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Show module health (exit 1 when a module is degraded, 2 when the agent is not running)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			code, body, err := apiGet(o, "/healthz")
			if err != nil {
				return err
			}
			var rep healthReport
			if err := json.Unmarshal(body, &rep); err != nil {
				return fmt.Errorf("agent answered %d with a body that is not a health report: %w", code, err)
			}
			w := cmd.OutOrStdout()
			switch {
			case asJSON && format == "":
				w.Write(body)
			case format != "":
				var raw any
				json.Unmarshal(body, &raw)
				if err := printAs(w, format, raw); err != nil {
					return err
				}
			default:
				t := newTable(w, "MODULE", "LEVEL")
				for _, m := range rep.Modules {
					t.row(m.Module, m.Level)
					for _, d := range m.Degraded {
						reason := d.Message
						if d.Error != "" && !strings.HasSuffix(reason, d.Error) {
							reason += ": " + d.Error
						}
						t.line("  " + d.Scope + ": " + reason)
					}
				}
				t.flush()
			}
			if !rep.OK {
				return errDegraded
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "Print the report as JSON (as -o json)")
	cmd.Flags().MarkDeprecated("json", "use -o json")
	outputFlag(cmd, &format)
	return cmd
}

// shellCommand is hive's shell client, with its socket defaulting into the
// state dir and a one-line answer when the agent is not running (hive's
// client would retry for 15 s).
func shellCommand(o *options) *cobra.Command {
	cmd := shell.ShellCmd(filepath.Join(defaultStateDir, "shell.sock"), "enimasq> ", func(w io.Writer) {
		fmt.Fprintln(w, "enimasq hive shell: 'help' lists commands, 'db' the tables, Ctrl-D quits.")
	})
	cmd.Use = "shell [-- COMMAND [ARGS...]]"
	cmd.Short = "Run a hive shell command, or an interactive shell without one"
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		f := cmd.Flags().Lookup(shell.ShellSockPathName)
		if !f.Changed {
			f.Value.Set(filepath.Join(o.stateDir, "shell.sock"))
		}
		conn, err := net.DialTimeout("unix", f.Value.String(), 2*time.Second)
		if err != nil {
			return agentapi.NotRunning(f.Value.String(), err)
		}
		return conn.Close()
	}
	return cmd
}
