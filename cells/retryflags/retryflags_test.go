package retryflags

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestDeclareAndValidate(t *testing.T) {
	flags := pflag.NewFlagSet("t", pflag.ContinueOnError)
	Declare(flags, "x", "thing", "Redo every thing", Values{time.Second, time.Minute, time.Hour})
	for name, want := range map[string]string{"x-retry-min": "1s", "x-retry-max": "1m0s", "x-refresh-interval": "1h0m0s"} {
		if f := flags.Lookup(name); f == nil || f.DefValue != want {
			t.Errorf("flag %s: %+v, want default %s", name, f, want)
		}
	}
	for _, tc := range []struct {
		v    Values
		want string
	}{
		{Values{time.Second, time.Minute, time.Hour}, ""},
		{Values{0, time.Minute, time.Hour}, "--x-retry-min 0s and --x-retry-max 1m0s: want 0 < min <= max"},
		{Values{time.Minute, time.Second, time.Hour}, "--x-retry-min 1m0s and --x-retry-max 1s"},
		{Values{time.Second, time.Minute, 0}, "--x-refresh-interval 0s: must be positive"},
	} {
		err := tc.v.Validate("x")
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.v, err, tc.want)
		}
	}
}
