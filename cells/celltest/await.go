package celltest

import (
	"testing"
	"time"
)

// Await re-runs check each time the channel it returned closes (a table's
// or a health report's watch channel) until it says done, and fails tb
// after timeout with what check last said. It is the one way the tests
// wait for rows: no polling, no sleep.
func Await(tb testing.TB, timeout time.Duration, check func() (done bool, changed <-chan struct{}, state string)) {
	tb.Helper()
	deadline := time.After(timeout)
	for {
		done, changed, state := check()
		if done {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			tb.Fatalf("timed out after %s: %s", timeout, state)
		}
	}
}
