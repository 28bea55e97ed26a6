package celltest

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// procPath is /proc/<pid>/<file>, /proc/self/<file> for pid 0.
func procPath(pid int, file string) string {
	if pid == 0 {
		return "/proc/self/" + file
	}
	return fmt.Sprintf("/proc/%d/%s", pid, file)
}

// ProcMemory is a size field of a process's /proc status (VmRSS: the
// resident set, VmHWM: its peak), in bytes; pid 0 is this process.
func ProcMemory(tb testing.TB, pid int, field string) uint64 {
	tb.Helper()
	data, err := os.ReadFile(procPath(pid, "status"))
	if err != nil {
		tb.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(field) + `:\s+(\d+) kB$`).FindSubmatch(data)
	if m == nil {
		tb.Fatalf("no %s in %s", field, procPath(pid, "status"))
	}
	kb, err := strconv.ParseUint(string(m[1]), 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return kb << 10
}

// ResetPeakRSS sets a process's VmHWM to its current resident set (proc(5),
// clear_refs); pid 0 is this process.
func ResetPeakRSS(tb testing.TB, pid int) {
	tb.Helper()
	if err := os.WriteFile(procPath(pid, "clear_refs"), []byte("5"), 0); err != nil {
		tb.Fatal(err)
	}
}
