// Package policybpf is the user-space side of the network policy
// programs (c/policy.c: policy_egress and policy_ingress, tc programs on the
// host side of every pod's device): the ABI of every map they read or
// write and the loader of the programs.
//
//   - The policy maps (policymaps.go, policyvalue.go): their names and
//     specs, the port entries; the values, lists of port intervals with an
//     action, whose tail spills into the chunk map; EvaluatePolicy, the
//     programs' decision in Go. (Their keys, a pod, a version and a peer
//     prefix, are package bpf's, which describes them in its errors.)
//   - The programs' state (policyct.go, policyctforget.go): the connection
//     table, the enforcing mode, the pods' map, the fragments.
//   - What they report (policyevents.go): the verdict counters and the
//     events of denied packets.
//   - The pods' policy versions (policyversions.go): enimasq_policy_versions,
//     switched once a pod's new version is whole.
//   - The programs (policyprog.go): LoadPolicyProgram binds them to the
//     maps; PolicyProgram.Run judges a frame with BPF_PROG_TEST_RUN.
//
// Why a package of its own: every layout here is struct for struct the one
// of c/policy.c (policy_bpfel.go is bpf2go's output of it, gen.go), so the
// program and its ABI change together, in one place. What policy maps share
// with every other map (the LPM keys, pinning, the reconciler operations,
// spill maps) is package bpf's, which knows nothing of policy.
package policybpf
