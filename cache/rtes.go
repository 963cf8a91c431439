package cache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/protocol"
)

// NewOwner returns an Owner for this start of an RTE: the hostname with anything outside
// [A-Za-z0-9._-] replaced by "-", then "-" and a random nonce. The nonce makes a restarted RTE
// a new owner, so it never adopts directories a previous process left half-written; those are
// swept once they go stale.
func NewOwner(hostname string) string {
	var b strings.Builder
	for _, r := range hostname {
		if r < 128 && (r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
		if b.Len() >= 100 {
			break
		}
	}
	if b.Len() == 0 {
		b.WriteString("rte")
	}
	var nonce [6]byte
	_, _ = rand.Read(nonce[:]) // crypto/rand.Read never fails on supported platforms
	return b.String() + "-" + hex.EncodeToString(nonce[:])
}

func validOwner(s string) bool {
	return s != "." && s != ".." && protocol.ValidJobID(s)
}

const aliveFile = "alive"

// Heartbeat marks this RTE alive, making its directory again if a sweep removed it (after a
// pause longer than StaleAfter; the jobs it had there are lost, which is logged).
func (c *Cache) Heartbeat() error {
	alive := filepath.Join(c.own, aliveFile)
	now := c.now()
	if err := os.Chtimes(alive, now, now); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cache heartbeat: %w", err)
	}
	if _, err := os.Stat(c.own); err == nil {
		c.log.Warn("this RTE's cache directory lost its heartbeat file; was it swept as stale by another RTE?", zap.String("dir", c.own))
	}
	for _, d := range []string{c.incoming, c.jobs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("cache heartbeat: make %s: %w", d, err)
		}
	}
	f, err := os.OpenFile(alive, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("cache heartbeat: %w", err)
	}
	f.Close()
	if err := os.Chtimes(alive, now, now); err != nil {
		return fmt.Errorf("cache heartbeat: %w", err)
	}
	return nil
}

// Run heartbeats and sweeps every quarter of StaleAfter until ctx is done, then returns nil.
// Errors are logged, not returned: a failed sweep is tried again at the next tick.
func (c *Cache) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.StaleAfter / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := c.Heartbeat(); err != nil {
			c.log.Error("cache heartbeat failed; other RTEs will sweep this one's job directories if it goes on", zap.Error(err))
		}
		if err := c.Sweep(); err != nil {
			c.log.Warn("cache sweep failed", zap.Error(err))
		}
	}
}

// Sweep removes the directory of every other RTE that has shown no sign of life for
// StaleAfter, the lock files of bundles that are neither in the cache nor pinned, and the
// frame indexes of bundles no longer in the cache.
func (c *Cache) Sweep() error {
	ents, err := os.ReadDir(c.rtes)
	if err != nil {
		return fmt.Errorf("cache sweep: %w", err)
	}
	now := c.now()
	var problems []error
	for _, e := range ents {
		if e.Name() == c.cfg.Owner || !e.IsDir() {
			continue
		}
		dir := filepath.Join(c.rtes, e.Name())
		last, ok := lastSign(dir)
		if !ok {
			continue // removed meanwhile by another sweeper
		}
		if idle := now.Sub(last); idle > c.cfg.StaleAfter {
			if err := bundle.RemoveTree(dir); err != nil {
				problems = append(problems, fmt.Errorf("remove %s: %w", dir, err))
				continue
			}
			c.log.Info("swept the cache directory of an RTE that stopped",
				zap.String("owner", e.Name()), zap.Duration("idle", idle.Round(time.Second)))
		}
	}
	if err := c.sweepLocks(); err != nil {
		problems = append(problems, err)
	}
	if err := c.sweepFrames(); err != nil {
		problems = append(problems, err)
	}
	if err := errors.Join(problems...); err != nil {
		return fmt.Errorf("cache sweep: %w", err)
	}
	return nil
}

// lastSign is the heartbeat time of an RTE directory, or the directory's own mtime while it
// has no heartbeat file yet (an RTE that is just starting).
func lastSign(dir string) (time.Time, bool) {
	if fi, err := os.Stat(filepath.Join(dir, aliveFile)); err == nil {
		return fi.ModTime(), true
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return time.Time{}, false
	}
	return fi.ModTime(), true
}

// sweepLocks removes lock files left by pins of bundles that never arrived.
func (c *Cache) sweepLocks() error {
	ents, err := os.ReadDir(c.locks)
	if err != nil {
		return err
	}
	for _, e := range ents {
		hexName, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok || !protocol.ValidHash("sha256:"+hexName) || c.Has("sha256:"+hexName) {
			continue
		}
		c.dropUnusedLock("sha256:" + hexName)
	}
	return nil
}

func (c *Cache) dropUnusedLock(hash string) {
	p := c.lockPath(hash)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil || !samePath(fd, p) || c.Has(hash) {
		return // pinned, replaced, or the bundle arrived meanwhile
	}
	os.Remove(p)
}

// JobDir makes a private (0700) directory for a job under this RTE's own directory and
// returns it with a cleanup that removes it, whatever is inside; cleanup is safe to call more
// than once. A job directory that already exists is refused: the job is running already.
func (c *Cache) JobDir(job string) (dir string, cleanup func(), err error) {
	if !protocol.ValidJobID(job) {
		return "", nil, fmt.Errorf("job directory: job id %q is not 1 to 128 of [A-Za-z0-9._-]", protocol.PeerText(job, 64))
	}
	if err := os.MkdirAll(c.jobs, 0o700); err != nil {
		return "", nil, fmt.Errorf("job directory: %w", err)
	}
	dir = filepath.Join(c.jobs, job)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return "", nil, fmt.Errorf("job directory %s already exists: job %s is already being prepared or run", dir, job)
		}
		return "", nil, fmt.Errorf("job directory: %w (check free space and permissions in RTE_CACHE_PATH)", err)
	}
	cleanup = sync.OnceFunc(func() {
		if err := bundle.RemoveTree(dir); err != nil {
			c.log.Error("remove job directory", zap.String("job", job), zap.String("dir", dir), zap.Error(err))
		}
	})
	return dir, cleanup, nil
}
