package compile

import (
	"net/netip"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// What a compilation is made of: the selection of a pod IP (what decides its
// entries) and the templates compiled for it, stamped per pod IP.

// selection is what decides a pod IP's entries: its family, the objects
// that select it (sorted by key: those that list it and the other slices
// of their policies, endpoints.Union) and the node IPs they give for it.
// Pods with equal selections get equal entries but for the pod IP in the
// key.
type selection struct {
	family bpf.Family
	pes    []*endpoints.PolicyEndpoint
	// pesKey identifies pes (objectSet).
	pesKey string
	hosts  []netip.Addr // sorted, of the family
}

// key identifies the selection while its objects are alive.
func (s selection) key() string {
	b := make([]byte, 0, 1+len(s.pesKey)+17*len(s.hosts))
	b = append(b, byte(s.family))
	b = append(b, s.pesKey...)
	for _, h := range s.hosts {
		b = append(b, '/')
		b = append(b, h.AsSlice()...)
	}
	return string(b)
}

// weight is the size of the selection's compile work: its rules and
// excepts in the directions its objects isolate.
func (s selection) weight() int {
	n := 0
	for _, pe := range s.pes {
		for _, d := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
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

// stamp appends the template's entries for a pod IP to out, from one
// block: each row points at its template entry.
func (t *policyTemplate) stamp(out []*PolicyMapEntry, pod netip.Addr) []*PolicyMapEntry {
	rows := make([]PolicyMapEntry, 0, t.n)
	for _, b := range t.blocks {
		for i := range b {
			rows = append(rows, PolicyMapEntry{Pod: pod, t: &b[i]})
			out = append(out, &rows[len(rows)-1])
		}
	}
	return out
}
