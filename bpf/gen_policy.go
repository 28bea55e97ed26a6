package bpf

// The policy verdict programs (c/policy.c), built like masq (see gen.go).
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" policy c/policy.c
