package celltest

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds, failing the test with what and the
// last state cond reported after 30 s. For state that has no watch channel
// (an API server's object, a kernel's).
func Eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached; last state: %s", what, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
