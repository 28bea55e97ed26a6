package bpf

import (
	"sync/atomic"

	"github.com/cilium/ebpf"
)

// countingMap wraps a real map and counts the element operations the kernel
// performs for it (a batch of n counts n) and the syscalls made.
type countingMap struct {
	*ebpf.Map
	updates, deletes, reads, syscalls atomic.Int64
}

var _ Map = (*countingMap)(nil)

func (c *countingMap) ops() int64 {
	return c.updates.Load() + c.deletes.Load() + c.reads.Load()
}

func (c *countingMap) reset() {
	c.updates.Store(0)
	c.deletes.Store(0)
	c.reads.Store(0)
	c.syscalls.Store(0)
}

// tried is the number of elements a batch call touched: the applied ones
// and, on error, the one the kernel stopped at.
func tried(n int, err error) int64 {
	if err != nil {
		return int64(n) + 1
	}
	return int64(n)
}

func (c *countingMap) Put(key, value any) error {
	c.updates.Add(1)
	c.syscalls.Add(1)
	return c.Map.Put(key, value)
}

func (c *countingMap) Delete(key any) error {
	c.deletes.Add(1)
	c.syscalls.Add(1)
	return c.Map.Delete(key)
}

func (c *countingMap) Lookup(key, valueOut any) error {
	c.reads.Add(1)
	c.syscalls.Add(1)
	return c.Map.Lookup(key, valueOut)
}

func (c *countingMap) NextKey(key, nextKeyOut any) error {
	c.reads.Add(1)
	c.syscalls.Add(1)
	return c.Map.NextKey(key, nextKeyOut)
}

func (c *countingMap) BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error) {
	n, err := c.Map.BatchUpdate(keys, values, opts)
	c.updates.Add(tried(n, err))
	c.syscalls.Add(1)
	return n, err
}

func (c *countingMap) BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error) {
	n, err := c.Map.BatchDelete(keys, opts)
	c.deletes.Add(tried(n, err))
	c.syscalls.Add(1)
	return n, err
}

func (c *countingMap) BatchLookup(cursor *ebpf.MapBatchCursor, keysOut, valuesOut any, opts *ebpf.BatchOptions) (int, error) {
	n, err := c.Map.BatchLookup(cursor, keysOut, valuesOut, opts)
	c.reads.Add(int64(n))
	c.syscalls.Add(1)
	return n, err
}
