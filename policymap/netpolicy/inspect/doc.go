// Package inspect reads the network-policy maps back from the kernel
// (dump.go: every entry decoded, sorted) and judges a packet on them
// (verdict.go): with the verdict program on kernel maps, or on fake maps by
// the entries alone, as the program decides (bpf/policybpf/c/policy.c). The policy
// maps' script commands and enimasq-dbg use it; it reads no table.
package inspect
