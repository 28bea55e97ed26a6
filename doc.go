// Package enimasq is the composition on top: Features, the group of feature
// cells an embedding agent links (nodeips, ipmasq, policymap, ipam), and
// Agent, the standalone enimasq-agent (Features plus the infrastructure of
// cells/infra).
//
// It is the only package that imports both the infrastructure and the
// features, the way Cilium's daemon/cmd/cells.go sits on pkg/hive; it is
// the module's root, above everything it composes. Below the features,
// cells/infra (statedb, jobs, health, shell, the unix-socket API, the node
// flags), cells/nodeconfig (the settings the embedding agent owns),
// cells/k8sclient, cells/filewatch, cells/filesource, cells/tablesync,
// cells/scriptcmd, cells/nodeips, cells/strictdecode and cells/errtext
// import no feature.
// The Cilium agent build (cmd/cilium-agent, its own module) links Features
// into Cilium's hive and provides nodeconfig.Config from Cilium's options.
package enimasq
