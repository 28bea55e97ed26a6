package bpf_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/bpf"
)

func TestFaultInjectorFaultFunc(t *testing.T) {
	ops, v4, _ := newFakeOps()
	fi := bpf.NewFaultInjector[*bpf.TestEntry](ops)
	es := bpf.V4Entries(t, "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32")
	fi.SetFaultFunc(func(mapName string, key []byte) error {
		if mapName == bpf.IPMasqV4MapName && bytes.Equal(key, es[1].MapKey()) {
			return errors.New("key refused by test")
		}
		return nil
	})

	batch := bpf.BatchOf(es...)
	fi.UpdateBatch(context.Background(), nil, batch)
	if batch[0].Result != nil || batch[2].Result != nil {
		t.Fatalf("healthy entries failed: %v, %v", batch[0].Result, batch[2].Result)
	}
	err := batch[1].Result
	if !errors.Is(err, bpf.ErrInjectedFault) || !strings.Contains(err.Error(), "update cilium_ipmasq_v4 key 10.0.0.2/32: injected fault: key refused by test") {
		t.Fatalf("faulty entry: %v", err)
	}
	if v4.Len() != 2 {
		t.Fatalf("%d entries in map, want 2", v4.Len())
	}
	if err := fi.Update(context.Background(), nil, 0, es[1]); !errors.Is(err, bpf.ErrInjectedFault) {
		t.Fatalf("Update: %v", err)
	}
	if err := fi.Delete(context.Background(), nil, 0, es[1]); !errors.Is(err, bpf.ErrInjectedFault) {
		t.Fatalf("Delete: %v", err)
	}

	fi.SetFaultFunc(nil)
	if err := fi.Update(context.Background(), nil, 0, es[1]); err != nil {
		t.Fatalf("Update after clearing the fault: %v", err)
	}
	batch = bpf.BatchOf(es...)
	fi.DeleteBatch(context.Background(), nil, batch)
	for _, be := range batch {
		if be.Result != nil {
			t.Fatalf("DeleteBatch: %v", be.Result)
		}
	}
	if v4.Len() != 0 {
		t.Fatalf("%d entries left", v4.Len())
	}
}

func TestFaultInjectorProbability(t *testing.T) {
	ops, v4, _ := newFakeOps()
	fi := bpf.NewFaultInjector[*bpf.TestEntry](ops)
	es := bpf.V4Entries(t, "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "10.0.0.4/32")

	fi.SetProbability(1)
	batch := bpf.BatchOf(es...)
	fi.UpdateBatch(context.Background(), nil, batch)
	for _, be := range batch {
		if !errors.Is(be.Result, bpf.ErrInjectedFault) {
			t.Fatalf("probability 1: result %v", be.Result)
		}
	}
	if v4.Len() != 0 {
		t.Fatalf("probability 1 let %d entries through", v4.Len())
	}

	fi.SetProbability(0)
	batch = bpf.BatchOf(es...)
	fi.UpdateBatch(context.Background(), nil, batch)
	for _, be := range batch {
		if be.Result != nil {
			t.Fatalf("probability 0: result %v", be.Result)
		}
	}

	for _, tt := range []struct{ in, want float64 }{{-1, 0}, {2, 1}, {0.25, 0.25}} {
		fi.SetProbability(tt.in)
		if got := fi.Probability(); got != tt.want {
			t.Errorf("SetProbability(%v): Probability() = %v, want %v", tt.in, got, tt.want)
		}
	}
}
