package bpf

// The keys a spill map holds, counted for its pressure (entries over max
// entries). An LPM map's entries are its objects in Done (a row is Done
// only while the kernel holds its key); a spill map's are not objects:
// chunks are content-addressed and shared by the entries with the same
// intervals, and only a prune deletes them. So Ops keeps the set of chunk
// keys the kernel holds: the keys listed when the map is set (the chunks of
// a previous run), plus every key written since, and again the keys listed
// after each prune, which is when chunks go. Listing a spill map (a hash)
// happens only then, never per scrape.

// spillHeld is the chunk keys one spill map holds.
type spillHeld struct {
	keys map[string]struct{}
	// relisting is non-nil while the map is listed: the keys written
	// meanwhile, which the listing may have missed.
	relisting map[string]struct{}
}

// SpillEntries returns how many keys the spill map of that name holds (the
// chunks the kernel holds: each distinct chunk once, however many entries
// share it); ok is false when name is no open spill map. It costs no
// syscall.
func (o *Ops[E]) SpillEntries(name string) (n int, ok bool) {
	o.spill.mu.Lock()
	defer o.spill.mu.Unlock()
	h, ok := o.spill.held[name]
	if !ok {
		return 0, false
	}
	return len(h.keys), true
}

// holdSpill records that the spill map holds key (just written). Called
// with o.spill.mu held.
func (o *Ops[E]) holdSpill(name string, key []byte) {
	h := o.spill.held[name]
	if h == nil {
		return // not open (or closed meanwhile)
	}
	h.keys[string(key)] = struct{}{}
	if h.relisting != nil {
		h.relisting[string(key)] = struct{}{}
	}
}

// recountSpill lists the keys of spill map m (nil: closed) and makes them
// the keys it holds, with those written during the listing. A failed
// listing keeps the keys held before.
func (o *Ops[E]) recountSpill(name string, m Map) {
	o.spill.mu.Lock()
	if m == nil {
		delete(o.spill.held, name)
		o.spill.mu.Unlock()
		return
	}
	if o.spill.held == nil {
		o.spill.held = map[string]*spillHeld{}
	}
	h := o.spill.held[name]
	first := h == nil
	if first {
		h = &spillHeld{keys: map[string]struct{}{}}
		o.spill.held[name] = h
	}
	h.relisting = map[string]struct{}{}
	o.spill.mu.Unlock()

	keys, err := listKeys(m)

	o.spill.mu.Lock()
	defer o.spill.mu.Unlock()
	if o.spill.held[name] != h { // closed or set again meanwhile
		return
	}
	written := h.relisting
	h.relisting = nil
	if err != nil {
		return
	}
	held := make(map[string]struct{}, keys.len()+len(written))
	for j := range keys.len() {
		held[string(keys.at(j))] = struct{}{}
	}
	// The chunks the map held when it was set are an earlier run's (or
	// another writer's): entries this run did not write may use them, so
	// they go only at a prune (spillrefs.go), and are forgotten once a
	// prune took them.
	if first {
		pre := make(map[string]struct{}, len(held))
		for k := range held {
			if _, w := written[k]; !w {
				pre[k] = struct{}{}
			}
		}
		if o.spill.pre == nil {
			o.spill.pre = map[string]map[string]struct{}{}
		}
		o.spill.pre[name] = pre
	} else {
		for k := range o.spill.pre[name] {
			if _, ok := held[k]; !ok {
				delete(o.spill.pre[name], k)
			}
		}
	}
	for k := range written {
		held[k] = struct{}{}
	}
	h.keys = held
}

// recountSpills lists every open spill map again (after a prune).
func (o *Ops[E]) recountSpills() {
	for name, m := range o.snapshot() {
		if o.isSpillMap(name) {
			o.recountSpill(name, m)
		}
	}
}
