package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/hive"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/dig"
	"k8s.io/klog/v2"

	"github.com/enimasq/enimasq"
	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/metrics"
)

// version is set at link time (-X main.version=...); otherwise the module
// version or "dev".
var version = ""

func agentVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// stopTimeout bounds shutdown: SIGTERM stops the agent within 5 s.
const stopTimeout = 4 * time.Second

func newAgentCommand(stdout, stderr io.Writer) (*cobra.Command, *hive.Hive) {
	h := enimasq.New(enimasq.Agent)
	var logLevel, logFormat string
	cmd := &cobra.Command{
		Use:           "enimasq-agent",
		Short:         "Keep ip-masq-agent CIDRs, BPF LPM maps and ENI pod ip rules in step",
		Version:       agentVersion(),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
			}
			metrics.Version = agentVersion() // enimasq_build_info
			log, err := newLogger(stderr, logFormat, level)
			if err != nil {
				return err
			}
			if err := checkDebugFlags(cmd.Flags()); err != nil {
				return err
			}
			// client-go logs through klog: route it to the same logger.
			// Each of its retry errors is logged once, as a file's error.
			klog.SetSlogLogger(k8sclient.Logger(log.With("subsys", "client-go")))
			// Files are 0600 and directories 0700 (the sockets are chmod'ed
			// to 0600 as they are made, in directories that are 0700). Not
			// 0177: a directory made 0600 cannot be entered without
			// CAP_DAC_OVERRIDE, which the DaemonSet's agent does not have.
			syscall.Umask(0o077)
			// hive.Run listens for signals only once the start is done: a
			// SIGTERM during the start (the kubelet stopping a pod that is
			// still coming up) would kill the process where it stands. Caught
			// from here on, it stops the agent as soon as it has started.
			signals := make(chan os.Signal, 1)
			signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
			defer func() { signal.Stop(signals); close(signals) }()
			go func() {
				if sig, ok := <-signals; ok {
					log.Info("Signal received", "signal", sig)
					h.Shutdown()
				}
			}()
			// The log threshold is a hive option (infra.HiveOptions): the
			// lifecycle takes it when the hive is built.
			return h.Run(log, hive.WithStopTimeout(stopTimeout))
		},
	}
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "Log level: debug, info, warn or error")
	cmd.Flags().StringVar(&logFormat, "log-format", "text", "Log format: text (logfmt) or json (one object a line)")
	h.RegisterFlags(cmd.Flags())
	cmd.CompletionOptions.DisableDefaultCmd = true
	if f := cmd.Flags().Lookup("shell-sock-path"); f != nil {
		f.Usage = "Hive shell unix socket (default <state-dir>/shell.sock)"
	}
	cmd.AddCommand(&cobra.Command{
		Use:    "flags-doc",
		Short:  "Print the flag reference as Markdown",
		Hidden: true,
		Args:   cobra.NoArgs,
		Run: func(c *cobra.Command, _ []string) {
			io.WriteString(stdout, flagsMarkdown(cmd.Flags()))
		},
	})
	return cmd, h
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd, _ := newAgentCommand(stdout, stderr)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(stderr, "enimasq-agent: %s\n", oneLine(err))
		return 1
	}
	return 0
}

// newLogger logs to w in format (text or json) from level up.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// debugOnlyFlags are testing flags accepted only with --enable-debug-shell.
var debugOnlyFlags = []string{"bpf-map-fault-probability"}

// checkDebugFlags refuses a fault-injection flag without
// --enable-debug-shell: a production agent never injects faults.
func checkDebugFlags(fs *pflag.FlagSet) error {
	if debug, _ := fs.GetBool(infra.EnableDebugShellFlag); debug {
		return nil
	}
	for _, name := range debugOnlyFlags {
		if f := fs.Lookup(name); f != nil && f.Changed {
			return fmt.Errorf("--%s is a testing flag: it needs --%s", name, infra.EnableDebugShellFlag)
		}
	}
	return nil
}

// oneLine reduces hive's multi-line dependency-injection errors to the cause.
func oneLine(err error) string {
	msg := dig.RootCause(err).Error()
	if i := strings.LastIndex(msg, "received non-nil error from function"); i >= 0 {
		if j := strings.Index(msg[i:], ": "); j >= 0 {
			msg = msg[i+j+2:]
		}
	}
	for _, prefix := range []string{"failed to start: ", "failed to populate object graph: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return strings.Join(strings.Fields(msg), " ")
}

// flagsMarkdown renders the flag reference (Documentation/flags.md).
func flagsMarkdown(fs *pflag.FlagSet) string {
	var b strings.Builder
	b.WriteString("# enimasq-agent flags\n\n")
	b.WriteString("Generated by `make docs` from the agent's own flag set; a test fails when it is out of date.\n\n")
	b.WriteString("| flag | type | default | description |\n|---|---|---|---|\n")
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		def := f.DefValue
		if def == "" || def == "[]" {
			def = "(empty)"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | `%s` | %s |\n", f.Name, f.Value.Type(), def, strings.ReplaceAll(f.Usage, "|", "\\|"))
	})
	return b.String()
}
