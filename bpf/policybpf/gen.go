package policybpf

// bpf2go compiles c/policy.c; its output (policy_bpfel.go, policy_bpfel.o) is
// committed so that building and testing need no clang. Regenerate with
// `make generate` (needs clang and libbpf-dev).
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" policy c/policy.c
