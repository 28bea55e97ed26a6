// cilium-agent is Cilium v1.20.2's agent with enimasq's cells linked in: the
// upstream daemon/main.go plus one more cell, as a downstream build of Cilium
// does. Cilium's flags toggle enimasq (see Documentation/cilium.md).
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
	cmd.Execute(cmd.NewAgentCmd(hiveFn))
}
