// Package awspeer runs the AWS network policy agent v1.5.0's own IPv4 egress
// program, handle_egress of its pkg/ebpf/c/tc.v4egress.bpf.c, compiled from
// its source, as a benchmark peer of enimasq's policy program. It is test
// support: nothing in production imports it, and it imports no enimasq
// package, so that the bpf package's own tests may.
//
// # Source and build
//
// The source is the module zip of github.com/aws/aws-network-policy-agent
// v1.5.0 in the Go module cache (`go mod download
// github.com/aws/aws-network-policy-agent@v1.5.0` fetches it; New runs it,
// outside any module, when the zip is missing). The zip is checked against
// its go.sum hash (ModuleSum) and pkg/ebpf/c is extracted from it, unchanged,
// into a temporary directory, with a vmlinux.h from `bpftool btf dump file
// /sys/kernel/btf/vmlinux format c`. tc.v4egress.bpf.c and v4events.bpf.c
// are compiled there with the flags of the agent's Makefile (build-bpf):
//
//	clang -g -O2 -Wall -fpie -target bpf -DCORE -D__BPF_TRACING__ -march=bpf -D__TARGET_ARCH_$(ARCH) -c
//
// (ARCH amd64 or arm64 for the tc programs, x86 for the events object, as
// there). The directory is removed afterwards; nothing of the agent's
// source is kept in this repository. The build needs clang, bpftool, the
// libbpf headers and kernel BTF; without them New's error wraps
// ErrMissingTools (apt-get install clang libbpf-dev bpftool) and the tests
// and benchmarks skip.
//
// # What is adapted, and why
//
// No C is changed: the object loaded is clang's, and the instructions of
// handle_egress are clang's but for the map references of its 64-bit loads,
// which every loader fills in (TestPeerProgramIsTheirs compares them with
// the compiled section). What differs from the agent is the loading, in
// collectionSpec, where cilium/ebpf replaces the agent's loader
// (aws-ebpf-sdk-go):
//
//   - The maps of the legacy SEC("maps") section are struct
//     bpf_map_def_pvt, libbpf's bpf_map_def and two more fields, pinning
//     (PIN_GLOBAL_NS) and inner_map_fd (0). cilium/ebpf refuses a
//     definition with non-zero trailing bytes; they are dropped (after
//     checking inner_map_fd is 0) and the maps are not pinned. Type, key and
//     value sizes, max_entries and flags are the source's.
//   - aws_conntrack_map and policy_events are declared in
//     tc.v4egress.bpf.c without a section or definition (tentative
//     definitions, which clang puts in .bss). The agent's loader relocates
//     every map reference by its symbol's name, and these two resolve to the
//     maps pinned as global_aws_conntrack_map and global_policy_events,
//     which the agent creates from v4events.bpf.c. cilium/ebpf would load
//     them as a pointer into a .bss array instead, which the verifier
//     refuses as a map. So v4events.bpf.c is compiled too, and the
//     references into .bss are made references, by symbol name, to its two
//     map definitions (an LRU hash of 524,288 connections, a 512 KiB ring
//     buffer), the .bss array dropped.
//   - SEC("tc_cls") is a section name of the agent's loader (a tc
//     classifier), unknown to cilium/ebpf: the program is loaded as
//     SchedCLS.
//   - cilium/ebpf also creates the .rodata array of NPA_FILE_VERSION, which
//     the program does not read.
//
// # Running it
//
// Peer.Run is BPF_PROG_TEST_RUN; a frame without a context runs on the
// network namespace's loopback device (ifindex 1, in the connection key).
// The program tracks every allowed connection in aws_conntrack_map
// (ResetConntrack, Forget) and writes an event for every decision to
// policy_events (Events reads them). The agent reads that ring only with
// --enable-policy-event-logs (default false); otherwise it stays full and
// every write fails, which FillEvents reproduces.
package awspeer
