package policybench

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/test/awspeer"
)

const (
	// runs is the repeat of one BPF_PROG_TEST_RUN; rounds how many are
	// taken of every column per benchmark iteration (the figures are
	// medians over all of them).
	runs   = 100_000
	rounds = 5
	// eventRuns is the repeat of one run with events on and the ring read:
	// 4,000 records fit enimasq's 256 KiB ring (64 bytes a record with its
	// header) and the AWS agent's 512 KiB one (40 bytes); eventCalls such
	// runs, the ring drained after each, make the 100,000 packets of the
	// other columns.
	eventRuns  = 4_000
	eventCalls = runs / eventRuns
	// prefixes is the number of peer prefixes of the pod
	// (BenchmarkPolicyProgramPerPacket's).
	prefixes = 1000
	// prevCommit is the commit whose bpf/policy_bpfel.o is "previous": the
	// program before the intervals, chunks, cluster maps and counters.
	prevCommit = "fb46384"
	prevObject = "bpf/policy_bpfel.o"
	// mapEntries is the size of the policy and tracking maps of every
	// enimasq program here (the previous program's own sizes).
	mapEntries = 65536
)

// tc verdicts of enimasq's programs.
const (
	tcActUnspec = 0xffffffff // allowed: the device's next program runs
	tcActShot   = 2
)

var (
	pod  = netip.MustParseAddr("10.0.0.5")
	peer = netip.MustParseAddr("10.1.2.3")
	// clusterPeer is the prefix of the cluster rules: it holds every peer.
	clusterPeer = netip.MustParsePrefix("10.1.0.0/16")
)

// peerPrefixes are the pod's peer prefixes: 10.1.0.1 to 10.1.3.232, /32s,
// peer (10.1.2.3) among them.
func peerPrefixes() []netip.Prefix {
	out := make([]netip.Prefix, 0, prefixes)
	for i := 1; i <= prefixes; i++ {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 32))
	}
	return out
}

// entryPort is the port of the i-th port entry: 1000, 1002, ... (never
// adjacent, so that every entry is an interval of its own in enimasq's
// values, which merge touching ports).
func entryPort(i int) uint16 { return uint16(1000 + 2*i) }

// deniedPort is the decided packet's port for n entries: just past the
// last entry, so that the scans of the previous and the AWS programs read
// every entry and enimasq's search goes through every chunk.
func deniedPort(n int) uint16 { return entryPort(n-1) + 1 }

// lastPort is the tracked packet's port: the last entry's.
func lastPort(n int) uint16 { return entryPort(n - 1) }

// The ClusterPolicyEndpoint rules of the "cpe" columns, in the AWS agent's
// form: Admin TCP 22 deny, a Pass over TCP 1000-1100 (the NetworkPolicy's
// ports: the NetworkPolicy-decided packet passes the Admin tier through
// it), UDP 53 accept; Baseline TCP 8080 accept, TCP 1-65535 deny, UDP 123
// accept, SCTP deny. adminPort is the packet the Admin tier denies.
const adminPort = 22

var awsCluster = []awspeer.ClusterRule{
	{Protocol: awspeer.ProtocolTCP, Priority: 100, Action: awspeer.ActionDeny, StartPort: adminPort},
	{Protocol: awspeer.ProtocolTCP, Priority: 200, Action: awspeer.ActionPass, StartPort: 1000, EndPort: 1100},
	{Protocol: awspeer.ProtocolUDP, Priority: 300, Action: awspeer.ActionAccept, StartPort: 53},
	{Protocol: awspeer.ProtocolTCP, Priority: awspeer.BaselinePriorityOffset + 100, Action: awspeer.ActionAccept, StartPort: 8080},
	{Protocol: awspeer.ProtocolTCP, Priority: awspeer.BaselinePriorityOffset + 200, Action: awspeer.ActionDeny, StartPort: 1, EndPort: 65535},
	{Protocol: awspeer.ProtocolUDP, Priority: awspeer.BaselinePriorityOffset + 300, Action: awspeer.ActionAccept, StartPort: 123},
	{Protocol: awspeer.ProtocolSCTP, Priority: awspeer.BaselinePriorityOffset + 400, Action: awspeer.ActionDeny},
}

// ourCluster is the same rules as enimasq's compiler paints them
// (compile/cluster.go): each segment of the port line with the Admin and
// the Baseline winner, a Pass an outcome without action that names its
// object, equal neighbours merged, segments nothing decides left out.
func ourCluster() *policybpf.PolicyValue {
	obj := func(name string) uint32 { return policybpf.ObjectID("ClusterPolicyEndpoint", name) }
	var (
		adminDeny    = policybpf.NewOutcome(policybpf.ActionDeny, obj("admin-100"))
		adminPass    = policybpf.NewOutcome(policybpf.ActionNone, obj("admin-200"))
		adminAccept  = policybpf.NewOutcome(policybpf.ActionAccept, obj("admin-300"))
		baseAccept   = policybpf.NewOutcome(policybpf.ActionAccept, obj("baseline-100"))
		baseDeny     = policybpf.NewOutcome(policybpf.ActionDeny, obj("baseline-200"))
		baseUDP      = policybpf.NewOutcome(policybpf.ActionAccept, obj("baseline-300"))
		baseSCTP     = policybpf.NewOutcome(policybpf.ActionDeny, obj("baseline-400"))
		tcp, udp, sc = policybpf.ProtocolTCP << 16, policybpf.ProtocolUDP << 16, policybpf.ProtocolSCTP << 16
	)
	return &policybpf.PolicyValue{Intervals: []policybpf.Interval{
		{Lo: tcp | 1, Hi: tcp | 21, Second: baseDeny},
		{Lo: tcp | adminPort, Hi: tcp | adminPort, First: adminDeny, Second: baseDeny},
		{Lo: tcp | 23, Hi: tcp | 999, Second: baseDeny},
		{Lo: tcp | 1000, Hi: tcp | 1100, First: adminPass, Second: baseDeny},
		{Lo: tcp | 1101, Hi: tcp | 8079, Second: baseDeny},
		{Lo: tcp | 8080, Hi: tcp | 8080, Second: baseAccept},
		{Lo: tcp | 8081, Hi: tcp | 0xffff, Second: baseDeny},
		{Lo: udp | 53, Hi: udp | 53, First: adminAccept},
		{Lo: udp | 123, Hi: udp | 123, Second: baseUDP},
		{Lo: sc, Hi: sc | 0xffff, Second: baseSCTP},
	}}
}

// BenchmarkPolicyPerPacketCompared is the kernel time per packet
// (BPF_PROG_TEST_RUN, 100,000 runs a call) of enimasq's policy program
// ("ours"), in the same run as an empty tc program (the floor), the policy
// program before this work ("prev": fb46384's object, its 24 {protocol,
// start_port, end_port} entries a value), the policy program before
// per-pod versions ("prever": 672e45b's object, today's values under keys
// without a version, no versions map) and the AWS agent v1.5.0's
// handle_egress ("aws", test/awspeer), each with the same policy in its own
// layout: one pod with 1,000 peer /32s, each with n TCP port entries
// (1000, 1002, ...), egress. Every column is a program of its own with maps
// of its own.
//
// A decided packet is denied (an allowed one would be tracked from the
// second run on): for n entries the port just past the last. ours1,
// ours24, ours30, ours1000: NetworkPolicy only (30 is past the old cap of
// 24, 1,000 past the 32 intervals of a value: 16 chunks walked;
// ours1000mid a port in a gap of the 8th chunk). ourscpe:
// the ClusterPolicyEndpoint rules of awsCluster on the pod's 10.1.0.0/16
// key besides its 24 entries, the packet passes the Admin tier (a Pass) and
// the NetworkPolicy denies it; oursadmin: the same maps, TCP 22, denied by
// the Admin tier. ours24ev: ours24 with events on, the ring buffer read
// (drained after every call of 4,000 runs, so every packet writes a
// record; the reader does not run during a call); ours24evfull: events
// on, the ring never read (full: every reservation fails). Tracked: the
// last entry's port, a connection opened by the call's first run (ours,
// prev, prever and aws at 24 entries). prever1 and prever24 hold ours1's
// and ours24's values (the same encoder).
//
// The AWS columns fill its events ring first (FillEvents), as its agent
// runs by default (policy event logs off: the program writes an event for
// every decision, into a ring nobody reads); aws24ev reads it as ours24ev
// does. awscpe and awsadmin have the pod states (PoliciesApplied,
// PoliciesApplied), the others (PoliciesApplied, DefaultAllow).
//
// Reported: every column as NAME-ns/pkt and NAME-x-empty, and the ratios
// NAME-x-OTHER of ratios (ours24-x-prev24 and ours1-x-prev1 must stay at
// most 1.2; ours1-x-prever1 and ours24-x-prever24 are what the per-pod
// version costs), from the medians of every call of the run; the same as a
// table on stdout, its lines starting with "#". The
// prev and prever columns are left out, with a log line saying why, when
// git or the object is not there (or the object is not the program
// expected); the aws columns when clang or bpftool are missing.
func BenchmarkPolicyPerPacketCompared(b *testing.B) {
	celltest.RequireRoot(b)
	var cols []column
	add := func(name string, fn func() (float64, error)) { cols = append(cols, column{name, fn}) }

	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { empty.Close() })
	emptyFrame := ourFrame(b, deniedPort(24))
	add("empty", func() (float64, error) { return timed(empty, emptyFrame, runs, 0) })

	// The previous program.
	if spec, why := previousSpec(b); spec == nil {
		b.Logf("prev columns skipped: %s", why)
	} else {
		for _, n := range []int{1, 24} {
			prog := newPrevious(b, spec, n)
			denied := ourFrame(b, deniedPort(n))
			add(fmt.Sprint("prev", n), func() (float64, error) { return timed(prog, denied, runs, tcActShot) })
			if n == 24 {
				tracked := ourFrame(b, lastPort(n))
				add("prev24tracked", func() (float64, error) { return timed(prog, tracked, runs, tcActUnspec) })
			}
		}
	}

	// The program before per-pod versions.
	if spec, why := preverSpec(b); spec == nil {
		b.Logf("prever columns skipped: %s", why)
	} else {
		for _, n := range []int{1, 24} {
			prog := newPrever(b, spec, n)
			denied := ourFrame(b, deniedPort(n))
			add(fmt.Sprint("prever", n), func() (float64, error) { return timed(prog, denied, runs, tcActShot) })
			if n == 24 {
				tracked := ourFrame(b, lastPort(n))
				add("prever24tracked", func() (float64, error) { return timed(prog, tracked, runs, tcActUnspec) })
			}
		}
	}

	// Ours.
	for _, n := range []int{1, 24, 30, 1000} {
		o := newOurs(b, ports(n), nil, policybpf.PolicyModeStandard)
		denied := ourFrame(b, deniedPort(n))
		o.check(b, denied, policybpf.PolicyDenied, policybpf.StepNamespace)
		add(fmt.Sprint("ours", n), func() (float64, error) { return timed(o.egress, denied, runs, tcActShot) })
		if n == 1000 {
			// A gap in the middle: the search walks 8 of the 16 chunks.
			mid := ourFrame(b, entryPort(n/2)+1)
			o.check(b, mid, policybpf.PolicyDenied, policybpf.StepNamespace)
			add("ours1000mid", func() (float64, error) { return timed(o.egress, mid, runs, tcActShot) })
		}
		if n == 24 {
			o.checkCounted(b, denied)
			tracked := ourFrame(b, lastPort(n))
			o.check(b, tracked, policybpf.PolicyAllowed, policybpf.StepNamespace)
			o.check(b, tracked, policybpf.PolicyTracked, policybpf.StepNone)
			add("ours24tracked", func() (float64, error) { return timed(o.egress, tracked, runs, tcActUnspec) })
		}
	}
	cpe := newOurs(b, ports(24), ourCluster(), policybpf.PolicyModeStandard)
	cpeDenied, adminDenied := ourFrame(b, deniedPort(24)), ourFrame(b, adminPort)
	cpe.check(b, cpeDenied, policybpf.PolicyDenied, policybpf.StepNamespace)
	cpe.check(b, adminDenied, policybpf.PolicyAdminDeny, policybpf.StepAdmin)
	add("ourscpe", func() (float64, error) { return timed(cpe.egress, cpeDenied, runs, tcActShot) })
	add("oursadmin", func() (float64, error) { return timed(cpe.egress, adminDenied, runs, tcActShot) })
	ev := newOurs(b, ports(24), nil, policybpf.PolicyModeStandard|policybpf.PolicyModeEvents)
	evDenied := ourFrame(b, deniedPort(24))
	ev.check(b, evDenied, policybpf.PolicyDenied, policybpf.StepNamespace)
	add("ours24ev", func() (float64, error) {
		return eventsRead(ev.egress, evDenied, tcActShot, ev.drain)
	})
	add("ours24evfull", func() (float64, error) {
		// Fill the ring (4,096 records), then time runs that find it full.
		if _, err := timed(ev.egress, evDenied, 5000, tcActShot); err != nil {
			return 0, err
		}
		return timed(ev.egress, evDenied, runs, tcActShot)
	})

	// The AWS agent's program.
	if probe, err := awspeer.New(); errors.Is(err, awspeer.ErrMissingTools) {
		b.Logf("aws columns skipped: %v", err)
	} else if err != nil {
		b.Fatal(err)
	} else {
		must(b, probe.Close())
		for _, n := range []int{1, 24} {
			p := newAWS(b, n, nil, true)
			denied := awsFrame(b, deniedPort(n))
			add(fmt.Sprint("aws", n), func() (float64, error) { return awsTimed(p, denied, runs, awspeer.VerdictShot) })
			if n == 24 {
				tracked := awsFrame(b, lastPort(n))
				add("aws24tracked", func() (float64, error) { return awsTimed(p, tracked, runs, awspeer.VerdictOK) })
			}
		}
		p := newAWS(b, 24, awsCluster, true)
		awsCPE, awsAdmin := awsFrame(b, deniedPort(24)), awsFrame(b, adminPort)
		add("awscpe", func() (float64, error) { return awsTimed(p, awsCPE, runs, awspeer.VerdictShot) })
		add("awsadmin", func() (float64, error) { return awsTimed(p, awsAdmin, runs, awspeer.VerdictShot) })
		pev := newAWS(b, 24, nil, false)
		awsEv := awsFrame(b, deniedPort(24))
		add("aws24ev", func() (float64, error) {
			return eventsRead(pev.Program(), awsEv, awspeer.VerdictShot, func() (int, error) {
				events, err := pev.Events()
				return len(events), err
			})
		})
	}

	// A round of every column, untimed, then rounds taken in turn, every
	// column once a round.
	samples := map[string][]float64{}
	round := func(keep bool) {
		for _, c := range cols {
			v, err := c.fn()
			if err != nil {
				b.Fatalf("%s: %v", c.name, err)
			}
			if keep {
				samples[c.name] = append(samples[c.name], v)
			}
		}
	}
	round(false)
	for b.Loop() {
		for range rounds {
			round(true)
		}
	}

	med := map[string]float64{}
	for _, c := range cols {
		med[c.name] = median(samples[c.name])
	}
	var table strings.Builder
	fmt.Fprintf(&table, "medians of %d calls each (%d runs a call, ns per run):\n", len(samples["empty"]), runs)
	fmt.Fprintf(&table, "# %-15s %8s %8s  %s\n", "column", "ns/pkt", "x-empty", "ratios")
	floor := med["empty"]
	for _, c := range cols {
		v := med[c.name]
		b.ReportMetric(v, c.name+"-ns/pkt")
		var rs []string
		if c.name != "empty" {
			b.ReportMetric(v/floor, c.name+"-x-empty")
		}
		for _, r := range ratios {
			if r[0] != c.name {
				continue
			}
			if den, ok := med[r[1]]; ok {
				b.ReportMetric(v/den, r[0]+"-x-"+r[1])
				rs = append(rs, fmt.Sprintf("x-%s %.2f", r[1], v/den))
			}
		}
		fmt.Fprintf(&table, "# %-15s %8.1f %8.2f  %s\n", c.name, v, v/floor, strings.Join(rs, ", "))
	}
	// The table goes to stdout: the testing package cuts a benchmark's
	// log to 10 lines.
	fmt.Printf("# %s, %s", b.Name(), table.String())
}

// ratios are the pairs reported as FIRST-x-SECOND: ours to the previous
// program at the same entries (and 30 and 1,000 entries to its cap of 24),
// ours to the program before per-pod versions at the same entries (what
// the version lookup costs),
// ours to the AWS agent's at the same contents, and events on to off.
var ratios = [][2]string{
	{"ours1", "prev1"},
	{"ours24", "prev24"},
	{"ours30", "prev24"},
	{"ours1000", "prev24"},
	{"ours1000mid", "prev24"},
	{"ours24tracked", "prev24tracked"},
	{"ours1", "prever1"},
	{"ours24", "prever24"},
	{"ours24tracked", "prever24tracked"},
	{"ours1", "aws1"},
	{"ours24", "aws24"},
	{"ours24tracked", "aws24tracked"},
	{"ourscpe", "awscpe"},
	{"oursadmin", "awsadmin"},
	{"ours24ev", "aws24ev"},
	{"ours24evfull", "aws24"},
	{"ours24ev", "ours24"},
	{"ours24evfull", "ours24"},
	{"ourscpe", "ours24"},
}

type column struct {
	name string
	fn   func() (float64, error)
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}
