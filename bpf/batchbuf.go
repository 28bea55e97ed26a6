package bpf

import (
	"reflect"
	"unsafe"
)

// batchBuf holds count fixed-size elements (keys or values) back to back in
// one buffer, typed as a Go slice of byte arrays so that cilium/ebpf hands
// it to the kernel as it is, without copying or reflection per element.
type batchBuf struct {
	slice reflect.Value // [][size]byte
	raw   []byte        // the same memory as bytes
	size  int
}

var byteType = reflect.TypeFor[byte]()

func newBatchBuf(size, count int) batchBuf {
	v := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(size, byteType)), count, count)
	var raw []byte
	if size > 0 && count > 0 {
		raw = unsafe.Slice((*byte)(v.UnsafePointer()), size*count)
	}
	return batchBuf{slice: v, raw: raw, size: size}
}

func (b batchBuf) len() int { return b.slice.Len() }

// set copies data into element i.
func (b batchBuf) set(i int, data []byte) {
	copy(b.raw[i*b.size:(i+1)*b.size], data)
}

// at returns element i, sharing the buffer's memory.
func (b batchBuf) at(i int) []byte {
	return b.raw[i*b.size : (i+1)*b.size : (i+1)*b.size]
}

// from returns elements i..len-1 as a slice for a batch syscall.
func (b batchBuf) from(i int) any {
	return b.slice.Slice(i, b.slice.Len()).Interface()
}

// batchBufOf copies raw, a whole number of size-byte elements, into a new
// buffer.
func batchBufOf(size int, raw []byte) batchBuf {
	b := newBatchBuf(size, len(raw)/size)
	copy(b.raw, raw)
	return b
}

// head returns the first n elements, sharing the buffer's memory.
func (b batchBuf) head(n int) batchBuf {
	return batchBuf{slice: b.slice.Slice(0, n), raw: b.raw[:n*b.size], size: b.size}
}
