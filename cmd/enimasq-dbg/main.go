// Command enimasq-dbg inspects a running enimasq-agent, like cilium-dbg:
// its statedb tables, its module health and its hive shell.
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	cmd := newRootCommand()
	err := cmd.Execute()
	var silent silentExit
	if err != nil && !errors.As(err, &silent) {
		fmt.Fprintf(os.Stderr, "enimasq-dbg: %s\n", err)
	}
	os.Exit(exitCodeOf(err))
}
