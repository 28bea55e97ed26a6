// Package masqbpf is masq_decision (c/masq.c), a BPF program that looks a
// destination up in the ipmasq maps (cilium_ipmasq_v4/v6, package bpf's
// specs) the way Cilium's datapath does, run with BPF_PROG_TEST_RUN on a
// frame: enimasq-dbg's "bpf ipmasq decide" and the ipmasq script tests use
// it to see what the kernel decides from the maps enimasq wrote.
// MasqDecideModel is the same decision in Go, for fake maps.
//
// It is a test program, not a datapath: nothing attaches it. It has a
// package of its own so that the program and its bpf2go output
// (masq_bpfel.go, gen.go) change together and package bpf knows no
// program.
package masqbpf
