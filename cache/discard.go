package cache

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/rte-project/rte/protocol"
)

// BadBundleError says a bundle in the cache will never unpack: Unpack refused one of its
// entries, it went past a limit, or its stream is corrupt. Its hash matched, so the app sent it
// as it is; unpacking it again cannot help, and the caller discards it (Discard) once it holds
// no pin on it. Failures of this machine (disk full, permissions) and a canceled context are
// other errors: the bundle may be fine.
type BadBundleError struct {
	Hash string
	Err  error
}

func (e *BadBundleError) Error() string { return fmt.Sprintf("unpack bundle %s: %v", e.Hash, e.Err) }

func (e *BadBundleError) Unwrap() error { return e.Err }

// isSystemError reports whether err came from a system call (a write, a mkdir, a read of the
// cached file), which says something about this machine rather than about the bundle.
func isSystemError(err error) bool {
	var errno syscall.Errno
	return errors.As(err, &errno)
}

// Discard removes a bundle from the cache unless an RTE has it pinned, and reports whether it
// is gone (true also when it was not there). Release this RTE's own pins on it first: a pin
// held by any open Acquire, in this process or another, keeps the bundle, and the job that
// holds it discards it in turn when it fails on it too.
func (c *Cache) Discard(hash string) (bool, error) {
	if !protocol.ValidHash(hash) {
		return false, fmt.Errorf("discard bundle: %q is not sha256: and 64 lowercase hex digits", protocol.PeerText(hash, 80))
	}
	c.evictMu.Lock()
	defer c.evictMu.Unlock()
	return c.remove(hash)
}

// JobsDir is this RTE's directory of job directories, rtes/<Owner>/jobs. A job directory made
// in it (by JobDir, or by the jobs package given it as its work directory) is removed with the
// rest of rtes/<Owner> by another RTE's sweep once this RTE has stopped heartbeating for
// StaleAfter, so a killed RTE leaves nothing behind for long, secrets included.
func (c *Cache) JobsDir() string { return c.jobs }
