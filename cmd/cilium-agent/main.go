// cilium-agent is Cilium v1.20.2's agent with enimasq's cells linked in: the
// upstream daemon/main.go plus one more cell, as a downstream build of Cilium
// does. Cilium's flags toggle enimasq (see Documentation/cilium.md);
// enimasq's own flags say "(enimasq)" in the help, and those that do
// nothing in this build are not on its command line (flags.go).
package main

import (
	"github.com/cilium/cilium/daemon/cmd"
	"github.com/cilium/cilium/pkg/hive"

	"github.com/enimasq/enimasq/cmd/cilium-agent/ciliumlink"
)

func main() {
	hiveFn := func() *hive.Hive {
		return hive.New(cmd.Agent, ciliumlink.Cell)
	}
	root := cmd.NewAgentCmd(hiveFn)
	markEnimasqFlags(root)
	cmd.Execute(root)
}
