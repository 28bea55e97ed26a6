package policymap

import (
	"fmt"
	"strconv"

	"github.com/cilium/hive/script"

	"github.com/enimasq/enimasq/bpf"
)

// FaultKeys says how a fault-injection command names the keys it fails:
// Args arguments a key (Usage shows them), made into the key by Encode.
type FaultKeys struct {
	Args   int
	Usage  string
	Encode func(args []string) ([]byte, error)
	// Normalize, if set, maps a key to what is compared (the policy keys'
	// version cleared: a fault names a key whatever its version).
	Normalize func(key []byte) []byte
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
					if k.Normalize != nil {
						key = k.Normalize(key)
					}
					failing[string(key)] = true
				}
				if len(failing) == 0 {
					maps.faults.SetFaultFunc(nil)
					return nil, nil
				}
				maps.faults.SetFaultFunc(func(_ string, key []byte) error {
					if k.Normalize != nil {
						key = k.Normalize(key)
					}
					if failing[string(key)] {
						return fmt.Errorf("injected: key refused")
					}
					return nil
				})
				return nil, nil
			}),
	}
}
