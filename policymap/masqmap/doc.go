// Package masqmap programs Cilium's masquerade exemption maps,
// cilium_ipmasq_v4 and cilium_ipmasq_v6, from the ip-masq-agent-cidrs table:
// a derived table masq-map-entries (one row per CIDR, in its family's map,
// or skipped with the reason when the family is not masqueraded on this
// node) reconciled into the pinned maps that Cilium's datapath reads.
//
// Files: cell.go (the cell and its registration), families.go (which
// family's map a CIDR goes in), table.go (masq-map-entries), script.go
// (kernel listing, the decision program, fault injection).
package masqmap
