package filesource

import "errors"

// Parts keeps the last good version of each part of an input made of
// parts (the files of a directory, the objects of the API server), by
// name: a part that goes bad keeps its last good version while the others
// apply.
type Parts[V any] struct {
	good map[string]V
}

// Read reads the parts named, each with read given its last good version
// (the zero V when it has none, to reuse an unchanged one). A part that
// fails keeps its last good version; parts not named are forgotten. It
// returns the good version of each part that has one, whether every part
// has one (else the input is incomplete) and the errors joined.
func (p *Parts[V]) Read(names []string, read func(name string, last V) (V, error)) (map[string]V, bool, error) {
	current := make(map[string]V, len(names))
	complete := true
	var errs []error
	for _, name := range names {
		last, ok := p.good[name]
		v, err := read(name, last)
		if err != nil {
			errs = append(errs, err)
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
