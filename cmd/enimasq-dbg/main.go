// Command enimasq-dbg inspects a running enimasq-agent, like cilium-dbg:
// its statedb tables, its module health and its hive shell.
package main

import (
	"fmt"
	"os"
)

func main() {
	cmd := newRootCommand()
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "enimasq-dbg: %s\n", err)
		os.Exit(1)
	}
}
