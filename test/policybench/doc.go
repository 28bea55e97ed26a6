// Package policybench holds BenchmarkPolicyPerPacketCompared: the kernel
// time per packet of enimasq's policy program (policybpf.LoadPolicyProgram),
// measured in one run against an empty tc program, against the policy
// program as it was before tiers, intervals, chunks and counters (the
// bpf/policy_bpfel.o of commit fb46384, read with git at bench time),
// against the policy program before per-pod versions (commit 672e45b's,
// likewise) and against the AWS network policy agent v1.5.0's own egress
// program (test/awspeer), each with the same policy in its own map layout.
//
// It is a package of its own because it is neither the bpf package's nor
// test/awspeer's: it uses only their exported API. Nothing imports it.
package policybench
