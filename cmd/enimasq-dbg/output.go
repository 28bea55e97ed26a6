package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/enimasq/enimasq/cells/agentapi"
)

// Exit codes, as cilium-dbg's and kubectl's: 0 OK, 1 an error or a
// degraded agent (or a DENY under policy verdict --exit-code), 2 the agent
// cannot be reached.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUnreachable = 2
)

// silentExit ends the command with code and no message: the output said
// it already (a degraded report, a DENY).
type silentExit struct{ code int }

func (e silentExit) Error() string { return fmt.Sprintf("exit %d", e.code) }

// errDegraded is the error of health and status on a degraded agent.
var errDegraded = errors.New("agent is degraded")

// exitCodeOf maps an error of a command to the process's exit code.
func exitCodeOf(err error) int {
	var silent silentExit
	var notRunning *agentapi.NotRunningError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &silent):
		return silent.code
	case errors.As(err, &notRunning):
		return exitUnreachable
	}
	return exitFailed
}

// outputFlag adds -o/--output (json or yaml; a table without it) to cmd.
func outputFlag(cmd *cobra.Command, format *string) {
	cmd.Flags().StringVarP(format, "output", "o", "", "Output format: json or yaml (a table without it)")
	cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		switch *format {
		case "", "json", "yaml":
		default:
			return fmt.Errorf("--output %q: want json or yaml", *format)
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

// printAs prints v as JSON or YAML (the JSON field names, as kubectl's).
func printAs(w io.Writer, format string, v any) error {
	if format == "yaml" {
		out, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	}
	return printJSON(w, v)
}

// table writes rows under a header, aligned, as kubectl's tables.
type table struct{ w *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cols ...string) { fmt.Fprintln(t.w, strings.Join(cols, "\t")) }

// line writes a line outside the columns (a detail under a row).
func (t *table) line(s string) { fmt.Fprintln(t.w, s) }

func (t *table) flush() error { return t.w.Flush() }

// failUnknownSubcommands makes every command that only groups others fail
// on an argument that is not one of them (cobra prints the help and exits
// 0), and print its help without one.
func failUnknownSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		failUnknownSubcommands(c)
	}
	if !cmd.HasSubCommands() || cmd.Runnable() {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unknown command %q for %q (run '%s --help' for its commands)", args[0], c.CommandPath(), c.CommandPath())
		}
		return c.Help()
	}
}
