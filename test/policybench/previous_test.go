package policybench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// gitSpec is the collection of object as commit holds it (read with git),
// or nil and why not.
func gitSpec(tb testing.TB, commit, object string) (*ebpf.CollectionSpec, string) {
	tb.Helper()
	out, err := exec.Command("git", "show", commit+":"+object).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Sprintf("git show %s:%s: %v", commit, object, err)
	}
	path := filepath.Join(tb.TempDir(), commit+"_"+filepath.Base(object))
	if err := os.WriteFile(path, out, 0o600); err != nil {
		tb.Fatal(err)
	}
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		return nil, fmt.Sprintf("%s of %s: %v", object, commit, err)
	}
	return spec, ""
}

// previousSpec is the collection of the previous program (prevCommit's
// object, read with git), or nil and why not.
func previousSpec(tb testing.TB) (*ebpf.CollectionSpec, string) {
	tb.Helper()
	spec, why := gitSpec(tb, prevCommit, prevObject)
	if spec == nil {
		return nil, why
	}
	m := spec.Maps[policybpf.PolicyEgressV4MapName]
	if spec.Programs["policy_egress"] == nil || m == nil || m.ValueSize != prevEntries*12 {
		return nil, fmt.Sprintf("%s of %s is not the program of %d-entry values", prevObject, prevCommit, prevEntries)
	}
	return spec, ""
}

// prevEntries is the previous program's entries a value.
const prevEntries = 24

// prevKey is the previous program's IPv4 key of pod and peer, which had no
// version: {u32 prefixlen = 32 + peer bits (host order); pod; peer} (network
// order).
func prevKey(pod netip.Addr, peer netip.Prefix) []byte {
	key := binary.NativeEndian.AppendUint32(nil, uint32(32+peer.Bits()))
	key = append(key, pod.AsSlice()...)
	return append(key, peer.Masked().Addr().AsSlice()...)
}

// newPrevious loads the previous program with maps of its own, n TCP port
// entries on each of the pod's peer prefixes, and checks its verdicts.
func newPrevious(tb testing.TB, spec *ebpf.CollectionSpec, n int) *ebpf.Program {
	tb.Helper()
	coll, err := ebpf.NewCollection(spec.Copy())
	if err != nil {
		tb.Fatalf("load the previous program: %v", err)
	}
	tb.Cleanup(coll.Close)
	val := make([]byte, prevEntries*12)
	for i := range n {
		binary.NativeEndian.PutUint32(val[12*i:], policybpf.ProtocolTCP)
		binary.NativeEndian.PutUint32(val[12*i+4:], uint32(entryPort(i)))
	}
	m := coll.Maps[policybpf.PolicyEgressV4MapName]
	for _, p := range peerPrefixes() {
		if err := m.Put(prevKey(pod, p), val); err != nil {
			tb.Fatal(err)
		}
	}
	prog := coll.Programs["policy_egress"]
	// Its reasons (skb->cb[0]): denied 2, allowed 1, tracked 5.
	run := func(frame []byte, wantRet, wantReason uint32) {
		tb.Helper()
		var in, out [48]uint32
		ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: &in, ContextOut: &out})
		if err != nil {
			tb.Fatal(err)
		}
		if ret != wantRet || out[12] != wantReason {
			tb.Fatalf("previous program: returned %#x, reason %d; want %#x, reason %d", ret, out[12], wantRet, wantReason)
		}
	}
	run(ourFrame(tb, deniedPort(n)), tcActShot, 2)
	if n == prevEntries {
		run(ourFrame(tb, lastPort(n)), tcActUnspec, 1)
		run(ourFrame(tb, lastPort(n)), tcActUnspec, 5)
	}
	return prog
}
