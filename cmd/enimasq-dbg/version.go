package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at link time (make build: -X main.version=$(git describe
// --always --dirty)); otherwise the module version or "dev".
var version = ""

func clientVersion() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	return "dev"
}

type versionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion,omitempty"`
	Platform  string `json:"platform,omitempty"`
	// Error says why the daemon's version is not known.
	Error string `json:"error,omitempty"`
}

type versionReport struct {
	Client versionInfo `json:"client"`
	Daemon versionInfo `json:"daemon"`
}

// versionCommand is `enimasq-dbg version`, as cilium-dbg's: the client's
// version and the running agent's (its enimasq_build_info metric).
func versionCommand(o *options) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of enimasq-dbg and of the running agent",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep := versionReport{Client: versionInfo{
				Version: clientVersion(), GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH,
			}}
			rep.Daemon = daemonVersion(o)
			w := cmd.OutOrStdout()
			if format != "" {
				return printAs(w, format, rep)
			}
			fmt.Fprintf(w, "Client: %s %s %s\n", rep.Client.Version, rep.Client.GoVersion, rep.Client.Platform)
			if rep.Daemon.Error != "" {
				fmt.Fprintf(w, "Daemon: unknown (%s)\n", rep.Daemon.Error)
			} else {
				fmt.Fprintf(w, "Daemon: %s %s\n", rep.Daemon.Version, rep.Daemon.GoVersion)
			}
			return nil
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

// daemonVersion reads the agent's enimasq_build_info{version,go_version}.
func daemonVersion(o *options) versionInfo {
	families, err := agentMetrics(o)
	if err != nil {
		return versionInfo{Error: err.Error()}
	}
	for _, m := range families["enimasq_build_info"].GetMetric() {
		var v versionInfo
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "version":
				v.Version = l.GetValue()
			case "go_version":
				v.GoVersion = l.GetValue()
			}
		}
		if v.Version != "" {
			return v
		}
	}
	return versionInfo{Error: "the agent reports no enimasq_build_info"}
}
