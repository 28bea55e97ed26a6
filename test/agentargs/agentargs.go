// Package agentargs checks a manifest's agent container against
// enimasq-agent's own flags (a package of its own: it links the whole
// agent, which the packages that test/k8stest serves are part of).
package agentargs

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq"
)

// Parse parses a manifest container's args as enimasq-agent's own
// flags: a DaemonSet that passes a flag the agent does not have fails.
func Parse(container map[string]any) (*pflag.FlagSet, error) {
	raw, _ := container["args"].([]any)
	args := make([]string, 0, len(raw))
	for _, a := range raw {
		s, ok := a.(string)
		if !ok {
			return nil, fmt.Errorf("agent args: %v is not a string", a)
		}
		args = append(args, s)
	}
	fs := pflag.NewFlagSet("enimasq-agent", pflag.ContinueOnError)
	enimasq.New(enimasq.Agent).RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("agent args %v: %w", args, err)
	}
	return fs, nil
}
