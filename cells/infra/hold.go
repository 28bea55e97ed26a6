package infra

import (
	"errors"
	"os"
	"path/filepath"
)

// HoldNode takes, without waiting, the locks an agent takes at start: the
// agent lock of the state dir (if the dir exists: no agent ever ran on a
// missing one) and the lock of the caller's network namespace. While the
// caller holds them no agent runs or starts on this state dir or in this
// namespace (enimasq-dbg cleanup removes the agent's state under them).
// Held by a running agent, it fails with an error wrapping
// ErrAlreadyRunning that names the lock.
func HoldNode(stateDir string) (interface{ Close() error }, error) {
	var locks nodeLocks
	if fi, err := os.Stat(stateDir); err == nil && fi.IsDir() {
		f, err := flock(filepath.Join(stateDir, "agent.lock"), "on --state-dir "+stateDir)
		if err != nil {
			return nil, err
		}
		locks = append(locks, f)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	f, err := lockNetNS(NetNSLockDir)
	if err != nil {
		locks.Close()
		return nil, err
	}
	return append(locks, f), nil
}
