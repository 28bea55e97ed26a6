package source

import "strings"

// oneLine joins errors (nested errors.Join included) with "; ", so that
// health names every bad input on one line; errors.Is and As still see
// each.
type oneLine []error

func joinErrors(err error) error {
	var out oneLine
	var flatten func(error)
	flatten = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				flatten(e)
			}
			return
		}
		if err != nil {
			out = append(out, err)
		}
	}
	flatten(err)
	if len(out) == 0 {
		return nil
	}
	return out
}

func (e oneLine) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e oneLine) Unwrap() []error { return e }
