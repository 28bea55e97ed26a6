// Command coredns is CoreDNS v1.15.0 with the plugins the tests' Corefile
// uses (bind, errors, file; test/coredns_helpers_test.go), built by
// ./build.sh: the whole of CoreDNS (every plugin, Kubernetes' and the
// clouds' clients) took about 9 minutes to build cold on 2 cores, this
// about one. Never imported.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
)

// The order in which the plugins handle a query, as plugin.cfg gives it.
func init() { dnsserver.Directives = []string{"bind", "errors", "file"} }

func main() { coremain.Run() }
