package enforce

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// awsFilters puts tc filters on the env's device as the AWS network policy
// agent v1.5.0 does (aws-ebpf-sdk-go's TCIngressAttach/TCEgressAttach): a
// clsact qdisc, then on each side a direct-action bpf filter at priority
// 1, handle 1, protocol all, named after the program (handle_ingress on
// the device's egress, what the pod receives; handle_egress on its
// ingress). The program returns TC_ACT_OK. It returns the filters'
// program IDs by side.
func (e *tcxEnv) awsFilters() map[string]ebpf.ProgramID {
	e.t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "handle_ingress", Type: ebpf.SchedCLS, License: "Apache-2.0",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}, // TC_ACT_OK
	})
	if err != nil {
		e.t.Fatalf("the AWS agent's program: %s", err)
	}
	e.t.Cleanup(func() { prog.Close() })
	info, _ := prog.Info()
	id, _ := info.ID()
	err = e.in(func() error {
		qdisc := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: e.att.Ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
			QdiscType:  "clsact",
		}
		if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		for parent, name := range map[uint32]string{netlink.HANDLE_MIN_EGRESS: "handle_ingress", netlink.HANDLE_MIN_INGRESS: "handle_egress"} {
			err := netlink.FilterAdd(&netlink.BpfFilter{
				FilterAttrs: netlink.FilterAttrs{LinkIndex: e.att.Ifindex, Parent: parent, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
				Fd:          prog.FD(), Name: name, DirectAction: true,
			})
			if err != nil {
				return fmt.Errorf("filter %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("the AWS agent's filters: %s", err)
	}
	return map[string]ebpf.ProgramID{"ingress": id, "egress": id}
}

// filters lists the device's tc filters on the side, as `tc filter show`.
func (e *tcxEnv) filters(h hook) []string {
	e.t.Helper()
	var out []string
	err := e.in(func() error {
		l, err := netlink.LinkByIndex(e.att.Ifindex)
		if err != nil {
			return err
		}
		fs, err := netlink.FilterList(l, h.parent)
		for _, f := range fs {
			if f.Attrs().Handle != 0 {
				out = append(out, describeFilter(f))
			}
		}
		return err
	})
	if err != nil {
		e.t.Fatalf("tc filter show: %s", err)
	}
	return out
}

// The AWS agent's filters on a device: enimasq's tcx program is attached
// first all the same, the row is an error naming the device, the side and
// the filter, the filters stay; once they are deleted, the row is Done.
func TestPrivilegedForeignTCFilterWithTCX(t *testing.T) {
	e := newTCXEnv(t)
	ids := e.awsFilters()
	err := e.update(e.ops)
	if err == nil {
		t.Fatal("attach beside the AWS agent's filters: no error")
	}
	for _, want := range []string{"enqpod0", "ingress of enqpod0", "egress of enqpod0", `tc bpf filter "handle_ingress" (pref 1, handle 0x1, program ` + fmt.Sprint(ids["egress"]),
		`"handle_egress"`, "decides first", "not removed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not say %s", err, want)
		}
	}
	for _, h := range hooks {
		if chain := e.chain(h); len(chain) != 1 || chain[0].ID != e.ours(h) {
			t.Errorf("%s: tcx chain %v, want enimasq's program alone", h.name, chain)
		}
		if fs := e.filters(h); len(fs) != 1 || !strings.Contains(fs[0], "pref 1, handle 0x1") {
			t.Errorf("%s: filters %v, want the AWS agent's left as they were", h.name, fs)
		}
	}
	e.in(func() error {
		l, _ := netlink.LinkByIndex(e.att.Ifindex)
		for _, h := range hooks {
			fs, _ := netlink.FilterList(l, h.parent)
			for _, f := range fs {
				if f.Attrs().Handle != 0 {
					netlink.FilterDel(f)
				}
			}
		}
		return nil
	})
	if err := e.update(e.ops); err != nil {
		t.Errorf("refresh with the AWS agent's filters deleted: %s", err)
	}
}

// With the tc fallback, the AWS agent's filters (priority 1) run before
// enimasq's (priority 0x3e57): enimasq's filter is put on the device, the
// error says the other decides first, and theirs stay.
func TestPrivilegedForeignTCFilterWithTC(t *testing.T) {
	e := newTCXEnv(t)
	e.ops.settings.Attach = AttachTC
	e.awsFilters()
	err := e.update(e.ops)
	if err == nil || !strings.Contains(err.Error(), "decides before enimasq's filter (pref 0x3e57)") {
		t.Fatalf("attach with the tc fallback beside the AWS agent's filters: error %v, want one saying it decides first", err)
	}
	for _, h := range hooks {
		fs := e.filters(h)
		if len(fs) != 2 || !strings.Contains(strings.Join(fs, " "), `"enimasq-policy" (pref 15959`) {
			t.Errorf("%s: filters %v, want the AWS agent's and enimasq's", h.name, fs)
		}
	}
}

// A classic filter (the bandwidth plugin's kind: shaping, mirroring) is
// not another enforcer: the row is Done.
func TestPrivilegedClassicTCFilterIsNoEnforcer(t *testing.T) {
	e := newTCXEnv(t)
	err := e.in(func() error {
		qdisc := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: e.att.Ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
			QdiscType:  "clsact",
		}
		if err := netlink.QdiscAdd(qdisc); err != nil {
			return err
		}
		// u32 matching every packet, with a class (no action module
		// needed), as `tc filter add ... u32 match u32 0 0 classid 1:1`.
		return netlink.FilterAdd(&netlink.U32{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: e.att.Ifindex, Parent: netlink.HANDLE_MIN_INGRESS, Protocol: unix.ETH_P_ALL, Priority: 1},
			ClassId:     netlink.MakeHandle(1, 1),
			Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{}}},
		})
	})
	if err != nil {
		t.Fatalf("u32 filter: %s", err)
	}
	if fs := e.filters(hooks[0]); len(fs) == 0 || !strings.Contains(fs[len(fs)-1], "tc u32 filter") {
		t.Fatalf("ingress filters %v: want the u32 filter", fs)
	}
	if err := e.update(e.ops); err != nil {
		t.Errorf("attach beside a u32 filter: %s", err)
	}
}
