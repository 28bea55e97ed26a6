// Package scriptcmd builds the hive script commands the features share for
// reading the kernel: one that prints a listing of kernel state (ip rules,
// routes, BPF map entries), and one that waits until that listing equals a
// file. The features' txtar tests assert the kernel with them, on the real
// kernel and on the fakes alike, and an operator runs the same commands in
// the hive shell.
package scriptcmd

import (
	"fmt"
	"os"
	"time"

	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"
)

// Lister prints kernel state, one line per object, in a stable order. It
// may read the command's flags.
type Lister func(s *script.State) (string, error)

// List is the command that prints what list prints.
func List(summary string, flags func(*pflag.FlagSet), list Lister) script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: summary, Flags: flags},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 0 {
				return nil, script.ErrUsage
			}
			out, err := list(s)
			if err != nil {
				return nil, err
			}
			return func(*script.State) (string, string, error) { return out, "", nil }, nil
		})
}

// Cmp is the command "<name> [--timeout d] file" that waits until what list
// prints equals the file; what names the state in the error. flags adds
// the lister's own flags.
func Cmp(summary, what string, flags func(*pflag.FlagSet), list Lister) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: summary,
			Args:    "file",
			Flags: func(fs *pflag.FlagSet) {
				if flags != nil {
					flags(fs)
				}
				fs.Duration("timeout", 5*time.Second, "How long to wait for the kernel state to match")
			},
			Detail: []string{
				"The kernel state is read every 10ms until it matches the file",
				"(in the format of the listing command) or the timeout passes.",
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			timeout, err := s.Flags.GetDuration("timeout")
			if err != nil {
				return nil, err
			}
			return nil, WaitMatches(s, args[0], timeout, what, func() (string, error) { return list(s) })
		})
}

// WaitMatches reads the kernel with list every 10 ms until it prints what
// the script file says, or the timeout passes. Polling, because BPF maps
// have no change notification, and so that the same wait serves the fakes.
func WaitMatches(s *script.State, file string, timeout time.Duration, what string, list func() (string, error)) error {
	want, err := os.ReadFile(s.Path(file))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		got, err := list()
		if err != nil {
			return err
		}
		if got == string(want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s do not match %s:\n%s", what, file, got)
		}
		select {
		case <-s.Context().Done():
			return s.Context().Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
