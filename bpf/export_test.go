package bpf

// The helpers of the internal tests, for the external ones (package
// bpf_test), which run on bpffake's maps.
type TestEntry = testEntry

var (
	NewTestEntry    = newTestEntry
	BatchOf         = batchOf
	V4Entries       = v4Entries
	BadPrefixLenKey = badPrefixLenKey
	MapPrefixes     = mapPrefixes
	KernelKey       = kernelKey
	EntrySeq        = entrySeq
	OpenTestMap     = openTestMap
	V4Prefixes      = v4Prefixes
)
