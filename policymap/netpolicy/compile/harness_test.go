package compile

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// policyHarness is a running hive with the policy tables, the compiler and
// the policy map reconciler on a private bpffs; the test plays the
// PolicyEndpoint source by writing policy-endpoints itself.
type policyHarness struct {
	tb        testing.TB
	db        *statedb.DB
	endpoints statedb.RWTable[*endpoints.PolicyEndpoint]
	entries   statedb.RWTable[*PolicyMapEntry]
	ops       *policymap.Maps[*PolicyMapEntry]
	state     *policyState
	versions  *policyVersions
	// versionsTable is policy-versions.
	versionsTable statedb.Table[*PodVersions]
	node          nodeconfig.Config
	initDone      func(statedb.WriteTxn) // nil once policy-endpoints is initialized
	stop          func()
}

type harnessOptions struct {
	node nodeconfig.Config // BPFRoot empty: a fresh private bpffs
	args []string          // extra flags
	// beforeStart runs once the bpffs exists, before the hive starts.
	beforeStart func(globalsDir string)
	// maxEntries sizes the maps (0: the default).
	maxEntries uint32
}

func startPolicyHarness(tb testing.TB, o harnessOptions) *policyHarness {
	tb.Helper()
	celltest.RequireRoot(tb)
	node := o.node
	if !node.EnableIPv4 && !node.EnableIPv6 {
		node.EnableIPv4 = true
	}
	if node.BPFRoot == "" {
		node.BPFRoot = celltest.MountBPFFS(tb)
	}
	if o.beforeStart != nil {
		o.beforeStart(node.GlobalsDir())
	}
	h := &policyHarness{tb: tb, node: node}
	hv := hive.New(
		statedb.Cell,
		job.Cell,
		cell.SimpleHealthCell,
		cell.Provide(func() nodeconfig.Config { return node }),
		cell.Module("policymap", "Policy maps under test",
			cell.ProvidePrivate(func(r job.Registry, health cell.Health, log *slog.Logger) job.Group {
				return r.NewGroup(health, job.WithLogger(log))
			}),
			cell.Config(policymap.DefaultConfig),
			cell.Provide(func() Settings { return Settings{MaxEntries: cmp.Or(o.maxEntries, policybpf.PolicyDefaultMaxEntries)} }),
			endpoints.Cell,
			Cell,
			cell.Invoke(func(db *statedb.DB, eps statedb.RWTable[*endpoints.PolicyEndpoint], ents statedb.RWTable[*PolicyMapEntry], ops *policymap.Maps[*PolicyMapEntry], st *policyState, vs *policyVersions, vt statedb.Table[*PodVersions]) {
				h.db, h.endpoints, h.entries, h.ops, h.state, h.versions, h.versionsTable = db, eps, ents, ops, st, vs, vt
				wtxn := db.WriteTxn(eps)
				h.initDone = eps.RegisterInitializer(wtxn, "test-source")
				wtxn.Commit()
			}),
		),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	hv.RegisterFlags(flags)
	args := append([]string{"--bpf-map-retry-min=5ms", "--bpf-map-retry-max=20ms"}, o.args...)
	if err := flags.Parse(args); err != nil {
		tb.Fatal(err)
	}
	log := hivetest.Logger(tb, hivetest.LogLevel(slog.LevelWarn))
	if err := hv.Start(log, context.Background()); err != nil {
		tb.Fatalf("start hive: %v", err)
	}
	stopped := false
	h.stop = func() {
		if stopped {
			return
		}
		stopped = true
		if err := hv.Stop(log, context.Background()); err != nil {
			tb.Errorf("stop hive: %v", err)
		}
	}
	tb.Cleanup(h.stop)
	return h
}

// setEndpoints makes policy-endpoints hold exactly pes, writing only the
// objects that differ, and marks it initialized.
func (h *policyHarness) setEndpoints(pes []*endpoints.PolicyEndpoint) {
	want := map[string]*endpoints.PolicyEndpoint{}
	for _, pe := range pes {
		want[pe.Key()] = pe
	}
	wtxn := h.db.WriteTxn(h.endpoints)
	var stale []*endpoints.PolicyEndpoint
	for old := range h.endpoints.All(wtxn) {
		if _, ok := want[old.Key()]; !ok {
			stale = append(stale, old)
		}
	}
	for _, old := range stale {
		h.endpoints.Delete(wtxn, old)
	}
	for _, key := range slices.Sorted(maps.Keys(want)) {
		old, _, found := h.endpoints.Get(wtxn, endpoints.PolicyEndpointNameIndex.Query(key))
		if found && reflect.DeepEqual(old, want[key]) {
			continue
		}
		h.endpoints.Insert(wtxn, want[key])
	}
	if h.initDone != nil {
		h.initDone(wtxn)
		h.initDone = nil
	}
	wtxn.Commit()
}

// entryID identifies the desired kernel state of an entry.
func entryID(e *PolicyMapEntry) string {
	return fmt.Sprintf("%s %x %x %s", e.Map(), bpf.PolicyKeyVersionless(e.MapKey()), e.MapValue(), e.EncodeError())
}

// waitConverged waits until policy-map-entries holds exactly want, every
// entry Done, and checks that the kernel maps hold exactly the same keys
// and values.
func (h *policyHarness) waitConverged(want []*PolicyMapEntry) {
	h.tb.Helper()
	wantIDs := map[string]bool{}
	for _, e := range want {
		wantIDs[entryID(e)] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		iter, watch := h.entries.AllWatch(h.db.ReadTxn())
		rows := statedb.Collect(iter)
		ok := len(rows) == len(wantIDs)
		for _, r := range rows {
			if !ok {
				break
			}
			ok = wantIDs[entryID(r)] && r.Status.Kind == reconciler.StatusKindDone
		}
		if ok {
			break
		}
		select {
		case <-watch:
		case <-ctx.Done():
			var lines []string
			for _, r := range rows {
				lines = append(lines, strings.Join(r.TableRow(), " "))
			}
			h.tb.Fatalf("policy-map-entries did not converge: have\n%s\nwant\n%s",
				strings.Join(lines, "\n"), strings.Join(entryLines(want), "\n"))
		}
	}
	// Every pod's newest version in force.
	for {
		iter, watch := h.versionsTable.AllWatch(h.db.ReadTxn())
		settled := true
		for v := range iter {
			settled = settled && v.settled()
		}
		if settled {
			break
		}
		select {
		case <-watch:
		case <-ctx.Done():
			h.tb.Fatal("the pods' versions did not settle")
		}
	}
	var wantKernel []string
	for _, e := range want {
		wantKernel = append(wantKernel, fmt.Sprintf("%s %x %x", e.Map(), bpf.PolicyKeyVersionless(e.MapKey()), e.MapValue()))
	}
	slices.Sort(wantKernel)
	// Deleted rows leave the table before their keys leave the kernel:
	// wait for the kernel too.
	for {
		got := h.kernelEntries()
		if slices.Equal(got, wantKernel) {
			return
		}
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			h.tb.Fatalf("kernel maps hold\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantKernel, "\n"))
		}
	}
}

// kernelEntries lists every entry of the open policy maps as "map key
// value" in hex, sorted; each key must decode as a valid key of its map's
// family.
func (h *policyHarness) kernelEntries() []string {
	h.tb.Helper()
	var out []string
	for name, m := range h.kernelMaps() {
		chunks := name == policybpf.PolicyChunksMapName
		_, fam, err := policybpf.ParsePolicyMapName(name)
		if err != nil && !chunks {
			h.tb.Fatal(err)
		}
		key := make([]byte, m.KeySize())
		value := make([]byte, m.ValueSize())
		iter := m.Iterate()
		for iter.Next(&key, &value) {
			if chunks {
				continue // content-addressed, pruned later: not compared
			}
			if _, _, err := bpf.UnmarshalPolicyKey(fam, key); err != nil {
				h.tb.Fatalf("%s holds an invalid key: %v", name, err)
			}
			out = append(out, fmt.Sprintf("%s %x %x", name, bpf.PolicyKeyVersionless(key), value))
		}
		if err := iter.Err(); err != nil {
			h.tb.Fatalf("iterate %s: %v", name, err)
		}
	}
	slices.Sort(out)
	return out
}

// rawKernelBytes returns all keys and values of the open maps, for byte
// comparisons.
func (h *policyHarness) rawKernelBytes() []byte {
	return []byte(strings.Join(h.kernelEntries(), "\n"))
}

// program loads the verdict program on the harness's maps.
func (h *policyHarness) program() *policybpf.PolicyProgram {
	h.tb.Helper()
	maps := h.kernelMaps()
	if k, ok := bpf.KernelMaps(h.versions.maps.Opened()); ok {
		maps[policybpf.PolicyVersionsMapName] = k[policybpf.PolicyVersionsMapName]
	}
	prog, err := policybpf.LoadPolicyProgram(maps)
	if err != nil {
		h.tb.Fatal(err)
	}
	h.tb.Cleanup(func() { prog.Close() })
	return prog
}

// run runs the program on a packet.
func runPacket(tb testing.TB, prog *policybpf.PolicyProgram, p packet) policybpf.PolicyResult {
	tb.Helper()
	src, dst := p.Pod, p.Peer
	if p.Dir == policybpf.Ingress {
		src, dst = p.Peer, p.Pod
	}
	frame, err := policybpf.PolicyTestFrame(src, dst, uint8(p.Proto), 40000, p.Port)
	if err != nil {
		tb.Fatal(err)
	}
	res, err := prog.Run(p.Dir, frame)
	if err != nil {
		tb.Fatal(err)
	}
	return res
}

// kernelMaps are the harness's maps, kernel maps (the harness runs as root).
func (h *policyHarness) kernelMaps() map[string]*ebpf.Map {
	h.tb.Helper()
	maps, ok := bpf.KernelMaps(h.ops.Opened())
	if !ok {
		h.tb.Fatal("the harness's maps are not kernel maps")
	}
	return maps
}
