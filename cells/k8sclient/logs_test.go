package k8sclient

import (
	"bytes"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"syscall"
	"testing"
)

// An outage's list and watch errors differ in their query and in the
// reflector's "failed to list" prefix: stable gives them one text.
func TestStableErrorOfAnOutage(t *testing.T) {
	refused := &url.Error{Op: "Get", Err: syscall.ECONNREFUSED}
	watch := *refused
	watch.URL = "https://127.0.0.1:6443/apis/cilium.io/v2/ciliumnodes?resourceVersion=209&timeoutSeconds=389&watch=true"
	list := *refused
	list.URL = "https://127.0.0.1:6443/apis/cilium.io/v2/ciliumnodes?limit=500&resourceVersion=0"
	listed := errors.Join(errors.New("failed to list *unstructured.Unstructured"), &list)
	const want = `Get "https://127.0.0.1:6443/apis/cilium.io/v2/ciliumnodes": connection refused`
	for _, err := range []error{&watch, &list, listed} {
		if got := stable(err).Error(); got != want {
			t.Errorf("stable(%q) = %q, want %q", err, got, want)
		}
		if !errors.Is(stable(err), syscall.ECONNREFUSED) {
			t.Errorf("stable(%q) lost its cause", err)
		}
	}
}

// client-go's repeats of an error go to DEBUG until the probe resets.
func TestClientGoErrorsOnce(t *testing.T) {
	var buf bytes.Buffer
	log := Logger(slog.New(slog.NewTextHandler(&buf, nil)))
	clientGoSeen.reset()
	for _, timeout := range []string{"389", "412", "501"} {
		log.Error("Failed to watch", "err", `Get "https://h/apis/x?timeoutSeconds=`+timeout+`": connection refused`)
	}
	log.Info("Warning: watch ended")
	if n := strings.Count(buf.String(), "Failed to watch"); n != 1 {
		t.Errorf("logged %d times at ERROR, want once:\n%s", n, buf.String())
	}
	clientGoSeen.reset()
	log.Error("Failed to watch", "err", `Get "https://h/apis/x?timeoutSeconds=7": connection refused`)
	if n := strings.Count(buf.String(), "Failed to watch"); n != 2 {
		t.Errorf("after a reset: logged %d times, want twice:\n%s", n, buf.String())
	}
}
