package errtext

import (
	"strings"
	"testing"
)

func TestValue(t *testing.T) {
	if got := Value([]byte(" \"http\"\n")); got != `"http"` {
		t.Errorf("trimmed: %s", got)
	}
	long := Value([]byte(strings.Repeat("a", 100)))
	if len(long) != 64 || !strings.HasSuffix(long, "...") {
		t.Errorf("shortened: %s", long)
	}
}
