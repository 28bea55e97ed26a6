package filesource

import (
	"errors"
	"runtime"
	"sync"
)

// Parts keeps the last good version of each part of an input made of
// parts (the objects of the API server), by
// name: a part that goes bad keeps its last good version while the others
// apply.
type Parts[V any] struct {
	good map[string]V
}

// Read reads the parts named, each with read given its last good version
// (the zero V when it has none, to reuse an unchanged one). A part that
// fails keeps its last good version; parts not named are forgotten. It
// returns the good version of each part that has one, whether every part
// has one (else the input is incomplete) and the errors joined, in the
// order of names.
//
// The parts are read in parallel, one per CPU at a time (a directory of
// large PolicyEndpoint files decodes in a fraction of the time): read must
// be safe for concurrent use.
func (p *Parts[V]) Read(names []string, read func(name string, last V) (V, error)) (map[string]V, bool, error) {
	type result struct {
		v   V
		err error
	}
	results := make([]result, len(names))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, name := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			v, err := read(name, p.good[name])
			results[i] = result{v, err}
		}()
	}
	wg.Wait()

	current := make(map[string]V, len(names))
	complete := true
	var errs []error
	for i, name := range names {
		v, err := results[i].v, results[i].err
		if err != nil {
			errs = append(errs, err)
			last, ok := p.good[name]
			if !ok {
				complete = false
				continue
			}
			v = last
		}
		current[name] = v
	}
	p.good = current
	return current, complete, errors.Join(errs...)
}
