package policymap

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/bpf"
)

// WaitKernelMatches reads the kernel with list every 10 ms until it prints
// what the script file says or the timeout passes. BPF maps have no change
// notification to wait on.
func WaitKernelMatches(s *script.State, file string, timeout time.Duration, what string, list func() (string, error)) error {
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

// CmpCommand is the script command that waits until the kernel's maps, as
// list prints them, equal a file: "<cmd> [flags] file". flags adds the
// command's own flags to --timeout.
func CmpCommand(summary, what string, flags func(*pflag.FlagSet), list func(s *script.State) (string, error)) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: summary,
			Args:    "file",
			Flags: func(fs *pflag.FlagSet) {
				if flags != nil {
					flags(fs)
				}
				fs.Duration("timeout", 5*time.Second, "How long to wait for the maps to match")
			},
			Detail: []string{
				"BPF maps have no change notification: the maps are read",
				"every 10ms until they match the file (the format of the",
				"list command) or the timeout passes.",
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
			return nil, WaitKernelMatches(s, args[0], timeout, what, func() (string, error) { return list(s) })
		})
}

// FaultKeys says how a fault-injection command names the keys it fails:
// Args arguments a key (Usage shows them), made into the key by Encode.
type FaultKeys struct {
	Args   int
	Usage  string
	Encode func(args []string) ([]byte, error)
}

// FaultCommands are the script commands that inject faults into the
// operations of maps: the command named probability makes that fraction of
// them fail, the one named keys the operations on the keys it names (none:
// stop failing).
func FaultCommands[E bpf.Entry](maps *Maps[E], what, probability, keys string, k FaultKeys) map[string]script.Cmd {
	return map[string]script.Cmd{
		probability: script.Command(
			script.CmdUsage{Summary: "Make this fraction of " + what + " operations fail", Args: "probability"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				p, err := strconv.ParseFloat(args[0], 64)
				if err != nil {
					return nil, err
				}
				maps.faults.SetProbability(p)
				return nil, nil
			}),
		keys: script.Command(
			script.CmdUsage{Summary: "Make operations on these " + what + " entries fail (none: stop)", Args: "[" + k.Usage + "]..."},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args)%k.Args != 0 {
					return nil, script.ErrUsage
				}
				failing := map[string]bool{}
				for i := 0; i < len(args); i += k.Args {
					key, err := k.Encode(args[i : i+k.Args])
					if err != nil {
						return nil, err
					}
					failing[string(key)] = true
				}
				if len(failing) == 0 {
					maps.faults.SetFaultFunc(nil)
					return nil, nil
				}
				maps.faults.SetFaultFunc(func(_ string, key []byte) error {
					if failing[string(key)] {
						return fmt.Errorf("injected: key refused")
					}
					return nil
				})
				return nil, nil
			}),
	}
}
