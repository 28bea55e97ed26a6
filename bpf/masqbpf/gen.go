package masqbpf

// bpf2go compiles c/masq.c; its output (masq_bpfel.go, masq_bpfel.o) is
// committed so that building and testing need no clang. Regenerate with
// `make generate` (needs clang and libbpf-dev).
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" masq c/masq.c
