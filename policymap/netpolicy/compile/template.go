package compile

import (
	"net/netip"
	"slices"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// What a compilation is made of: the selection of a pod IP (what decides its
// entries) and the templates compiled for it, stamped per pod IP.

// selection is what decides a pod IP's entries: its family, the objects
// that select it (sorted by key: those that list it and the other slices
// of their policies, endpoints.Union) and the node IPs they give for it.
// Pods with equal selections get equal entries but for the pod IP in the
// key.
type selection[T endpoints.Slice] struct {
	family bpf.Family
	objs   []T
	// objsKey identifies objs (objectSet).
	objsKey string
	hosts   []netip.Addr // sorted, of the family
	// named are the objects objs were made from when they are copies with
	// their name rules' addresses (names.go): objsKey holds their
	// addresses, so the selection keeps them alive (no other object
	// takes one of their addresses while its key is in use).
	named []T
}

// selectionOf returns the selection of a pod IP: set is the objects that
// decide for it (endpoints.Union: those that list it and the other slices
// of their policies), listing holds those that list it (others are
// skipped), and entry finds its entry in one (the node IP); false if none
// lists it. The node IP is the objects' hostIP: from the API server only
// pods whose hostIP is one of this node's addresses are taken (the
// source's node rule), stand-ins' too.
func selectionOf[T endpoints.Slice](pod netip.Addr, set objectSet[T], listing []T, entry func(T) (endpoints.PodEndpoint, bool)) (selection[T], bool) {
	sel := selection[T]{family: bpf.FamilyOf(pod), objs: set.objs, objsKey: set.key}
	listed := false
	for _, o := range listing {
		e, ok := entry(o)
		if !ok {
			continue
		}
		listed = true
		if h := e.HostIP; h.IsValid() && bpf.FamilyOf(h) == sel.family && !slices.Contains(sel.hosts, h) {
			sel.hosts = append(sel.hosts, h)
		}
	}
	slices.SortFunc(sel.hosts, netip.Addr.Compare)
	return sel, listed
}

// key identifies the selection while its objects are alive.
func (s selection[T]) key() string {
	b := make([]byte, 0, 1+len(s.objsKey)+17*len(s.hosts))
	b = append(b, byte(s.family))
	b = append(b, s.objsKey...)
	for _, h := range s.hosts {
		b = append(b, '/')
		b = append(b, h.AsSlice()...)
	}
	return string(b)
}

// weight is the size of a NetworkPolicy selection's compile work: its
// rules and excepts in the directions its objects isolate.
func weight(s selection[*endpoints.PolicyEndpoint]) int {
	n := 0
	for _, pe := range s.objs {
		for _, d := range []policybpf.Direction{policybpf.Egress, policybpf.Ingress} {
			if !pe.Isolates(d) {
				continue
			}
			for _, r := range pe.Rules(d) {
				n += 1 + len(r.Except)
			}
		}
	}
	return n
}

// policyTemplate is the compiled entries of one map for every pod IP of
// one selection: peers and values, without the pod IP. Immutable; the rows
// stamped from it point at its entries.
type policyTemplate struct {
	mapName string
	// blocks hold the entries, in order, templateBlock to a block.
	blocks [][]templateEntry
	n      int
}

// templateBlock is how many template entries are allocated together. A
// row keeps the block of its entry alive, not the template: after an edit
// of a large PolicyEndpoint, the rows that did not change still point at
// the old template, and a template of 50,000 rules is 4 MB.
const templateBlock = 256

// reserve allocates the blocks for up to n entries before they are
// compiled: allocated while the sweep ran, they made a 50k-rule compile
// that meets the collector two to three times slower here. done drops the
// blocks left empty.
func (t *policyTemplate) reserve(n int) {
	for ; n > 0; n -= templateBlock {
		t.blocks = append(t.blocks, make([]templateEntry, 0, min(n, templateBlock)))
	}
}

func (t *policyTemplate) done() {
	t.blocks = t.blocks[:(t.n+templateBlock-1)/templateBlock]
}

// add appends an entry to the template: block i holds entries
// i*templateBlock to (i+1)*templateBlock-1.
func (t *policyTemplate) add(e templateEntry) {
	i := t.n / templateBlock
	if i == len(t.blocks) {
		t.blocks = append(t.blocks, nil)
	}
	e.mapName = t.mapName
	t.blocks[i] = append(t.blocks[i], e)
	t.n++
}

// stamp appends the template's entries for a pod IP to out, as rows of
// kind K, from one block: each row points at its template entry.
func stamp[K entryKind](t *policyTemplate, out []*MapEntry[K], pod netip.Addr) []*MapEntry[K] {
	rows := make([]MapEntry[K], 0, t.n)
	for _, b := range t.blocks {
		for i := range b {
			rows = append(rows, MapEntry[K]{Pod: pod, t: &b[i]})
			out = append(out, &rows[len(rows)-1])
		}
	}
	return out
}
