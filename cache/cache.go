package cache

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/protocol"
)

// DefaultStaleAfter is how long an RTE may show no sign of life before another RTE sharing the
// cache removes its directory. Heartbeats come every quarter of it, so a live RTE would have to
// miss three in a row.
const DefaultStaleAfter = 10 * time.Minute

// Config is what a Cache needs. Dir, MaxBytes and Owner are required.
type Config struct {
	// Dir is RTE_CACHE_PATH. Several RTEs may share it; they must run as the same user.
	Dir string
	// MaxBytes is RTE_CACHE_MB << 20: the bundles kept, compressed. Pinned bundles may hold
	// the cache above it for as long as they are pinned.
	MaxBytes int64
	// Owner names this RTE's own directory, rtes/<Owner>: 1 to 128 of [A-Za-z0-9._-], unique
	// among live RTEs sharing Dir. NewOwner makes one from the hostname and a start nonce.
	Owner  string
	Logger *zap.Logger
	// Now is the clock for heartbeats, the sweep and least-recently-used times; default time.Now.
	Now func() time.Time
	// StaleAfter is how long another RTE may show no sign of life before its directory is
	// swept; default DefaultStaleAfter.
	StaleAfter time.Duration
	// Unpack bounds what one bundle may unpack to; zero fields take package bundle's defaults.
	Unpack bundle.UnpackLimits
}

// Cache is a bundle cache in one directory. Its methods are safe for concurrent use, and
// other Cache values (in this process or other RTEs) may use the same directory at once.
type Cache struct {
	cfg      Config
	log      *zap.Logger
	bundles  string
	frames   string // frame indexes of bundles, see frames.go
	locks    string
	rtes     string
	own      string // rtes/<Owner>
	incoming string
	jobs     string

	evictMu sync.Mutex // one eviction at a time in this process; other RTEs are kept off by flock

	// For Stats: this process's lookups and evictions (other RTEs sharing the folder count
	// their own).
	hits, misses, evictions atomic.Int64
}

// Stats are the cache's numbers for metrics.
type Stats struct {
	Bytes     int64 // bundles in the folder now, by every RTE sharing it
	Bundles   int   // how many
	Hits      int64 // bundles a job needed that were in the cache (Missing found them)
	Misses    int64 // bundles a job needed that had to be fetched
	Evictions int64 // bundles this process removed to stay within MaxBytes
}

// Stats lists the bundle folder for its size; the counters are since Open.
func (c *Cache) Stats() (Stats, error) {
	files, total, err := bundle.Stored(c.bundles)
	return Stats{Bytes: total, Bundles: len(files), Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load()}, err
}

// Open makes the cache's directories, clears what a previous process of the same Owner left
// in its own directory, and heartbeats once.
func Open(cfg Config) (*Cache, error) {
	var problems []error
	if cfg.Dir == "" {
		problems = append(problems, errors.New("cache: Dir (RTE_CACHE_PATH) is required"))
	}
	if cfg.MaxBytes <= 0 {
		problems = append(problems, fmt.Errorf("cache: MaxBytes (RTE_CACHE_MB) must be positive, got %d bytes", cfg.MaxBytes))
	}
	if !validOwner(cfg.Owner) {
		problems = append(problems, fmt.Errorf("cache: Owner %q is not 1 to 128 of [A-Za-z0-9._-]; use NewOwner", protocol.PeerText(cfg.Owner, 64)))
	}
	if cfg.StaleAfter < 0 {
		problems = append(problems, fmt.Errorf("cache: StaleAfter must not be negative, got %s", cfg.StaleAfter))
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StaleAfter == 0 {
		cfg.StaleAfter = DefaultStaleAfter
	}
	c := &Cache{
		cfg:     cfg,
		log:     cfg.Logger.Named("cache"),
		bundles: filepath.Join(cfg.Dir, "bundles"),
		frames:  filepath.Join(cfg.Dir, "frames"),
		locks:   filepath.Join(cfg.Dir, "locks"),
		rtes:    filepath.Join(cfg.Dir, "rtes"),
	}
	c.own = filepath.Join(c.rtes, cfg.Owner)
	c.incoming = filepath.Join(c.own, "incoming")
	c.jobs = filepath.Join(c.own, "jobs")
	for _, d := range []string{c.bundles, c.frames, c.locks, c.rtes} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("cache: make %s: %w (check RTE_CACHE_PATH and its permissions)", d, err)
		}
	}
	// A previous process under this Owner is gone (Owners are unique among live RTEs), and
	// nothing it was receiving or running survives it.
	for _, d := range []string{c.incoming, c.jobs} {
		if err := bundle.RemoveTree(d); err != nil {
			return nil, fmt.Errorf("cache: clear %s: %w", d, err)
		}
	}
	if err := c.Heartbeat(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cache) now() time.Time { return c.cfg.Now() }

func (c *Cache) bundlePath(hash string) string { return bundle.FilePath(c.bundles, hash) }

func (c *Cache) lockPath(hash string) string {
	return filepath.Join(c.locks, strings.TrimPrefix(hash, "sha256:")+".lock")
}

// Has reports whether the bundle is in the cache. Only complete, verified bundles have a name
// there, so present means complete.
func (c *Cache) Has(hash string) bool {
	if !protocol.ValidHash(hash) {
		return false
	}
	fi, err := os.Stat(c.bundlePath(hash))
	return err == nil && fi.Mode().IsRegular()
}

// Missing returns, in order and without repeats, those of hashes the cache lacks: what the
// RTE asks the app for in bundle.want.
func (c *Cache) Missing(hashes []string) []string {
	var out []string
	for i, h := range hashes {
		if slices.Contains(hashes[:i], h) {
			continue
		}
		if c.Has(h) {
			c.hits.Add(1)
		} else {
			c.misses.Add(1)
			out = append(out, h)
		}
	}
	return out
}

// TooLargeError says a bundle, or a job's bundles together, cannot fit in the cache at all.
type TooLargeError struct {
	What  string // the bundle's hash, or "the job's bundles"
	Size  int64
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s take %.1f MiB, more than this RTE's whole bundle cache (RTE_CACHE_MB=%d); raise RTE_CACHE_MB or mount the files on the RTE (RTE_FILES=local)",
		e.What, float64(e.Size)/(1<<20), e.Limit>>20)
}

// Incoming is one bundle being received. WriteAt and Commit may be called from different
// goroutines, but not after Commit or Abort.
type Incoming struct {
	c    *Cache
	hash string
	want [32]byte
	size int64
	path string

	mu      sync.Mutex
	f       *os.File
	h       hash.Hash
	hashed  int64 // bytes from offset 0 fed to h, while chunks arrive in order
	inOrder bool
	done    bool
}

// Receive starts receiving a bundle of expectedSize bytes into a temporary file of this RTE's
// own. Several receivers of one bundle, in this RTE or others, are safe: each has its own
// file, and the first Commit names the bundle.
func (c *Cache) Receive(hash string, expectedSize int64) (*Incoming, error) {
	want, err := protocol.ParseHash(hash)
	if err != nil {
		return nil, fmt.Errorf("receive bundle: %w", err)
	}
	if expectedSize < 0 {
		return nil, fmt.Errorf("receive bundle %s: size %d is negative", hash, expectedSize)
	}
	if expectedSize > c.cfg.MaxBytes {
		return nil, &TooLargeError{What: "bundle " + hash, Size: expectedSize, Limit: c.cfg.MaxBytes}
	}
	if err := os.MkdirAll(c.incoming, 0o700); err != nil {
		return nil, fmt.Errorf("receive bundle %s: %w", hash, err)
	}
	f, err := os.CreateTemp(c.incoming, strings.TrimPrefix(hash, "sha256:")+".*.part")
	if err != nil {
		return nil, fmt.Errorf("receive bundle %s: %w (check free space in RTE_CACHE_PATH)", hash, err)
	}
	return &Incoming{c: c, hash: hash, want: want, size: expectedSize, path: f.Name(), f: f, h: sha256.New(), inOrder: true}, nil
}

// WriteAt stores one chunk. Chunks may come in any order and again; the hash is computed as
// they come while they come in order, and by reading the file back otherwise.
func (in *Incoming) WriteAt(p []byte, off int64) (int, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.done {
		return 0, fmt.Errorf("bundle %s: chunk after the bundle was committed or aborted", in.hash)
	}
	if off < 0 || off > in.size || int64(len(p)) > in.size-off {
		return 0, fmt.Errorf("bundle %s: chunk at offset %d with %d bytes goes past its announced size of %d bytes", in.hash, off, len(p), in.size)
	}
	n, err := in.f.WriteAt(p, off)
	if err != nil {
		return n, fmt.Errorf("bundle %s: write chunk at offset %d: %w (check free space in RTE_CACHE_PATH)", in.hash, off, err)
	}
	if in.inOrder && off == in.hashed {
		in.h.Write(p)
		in.hashed += int64(n)
	} else {
		in.inOrder = false
	}
	return n, nil
}

// Commit checks that the bundle has size bytes (what bundle.end says, which must be what
// job.start announced) and hashes to its name, then names it in the cache and evicts others
// if the cache is over MaxBytes. A bundle that does not match is discarded, with an error
// naming it and what did not match. If another receiver named the same bundle first, Commit
// discards this copy and succeeds.
func (in *Incoming) Commit(size int64) (err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.done {
		return fmt.Errorf("bundle %s: already committed or aborted", in.hash)
	}
	in.done = true
	defer func() {
		if err != nil {
			in.f.Close()
			os.Remove(in.path)
		}
	}()
	if size != in.size {
		return fmt.Errorf("bundle %s discarded: bundle.end says %d bytes, but %d were announced", in.hash, size, in.size)
	}
	fi, err := in.f.Stat()
	if err != nil {
		return fmt.Errorf("bundle %s: %w", in.hash, err)
	}
	if fi.Size() != size {
		return fmt.Errorf("bundle %s discarded: truncated, %d of %d bytes arrived", in.hash, fi.Size(), size)
	}
	var got []byte
	if in.inOrder && in.hashed == size {
		got = in.h.Sum(nil)
	} else {
		h := sha256.New()
		if _, err := io.Copy(h, io.NewSectionReader(in.f, 0, size)); err != nil {
			return fmt.Errorf("bundle %s: read back: %w", in.hash, err)
		}
		got = h.Sum(nil)
	}
	if string(got) != string(in.want[:]) {
		return fmt.Errorf("bundle %s discarded: its %d bytes hash to sha256:%s, not to its name", in.hash, size, hex.EncodeToString(got))
	}
	// Synced before it is named: a named bundle is trusted without being hashed again, so a
	// crash must not leave a name on torn bytes.
	if err := in.f.Sync(); err != nil {
		return fmt.Errorf("bundle %s: sync: %w", in.hash, err)
	}
	if err := in.f.Close(); err != nil {
		return fmt.Errorf("bundle %s: close: %w", in.hash, err)
	}
	if err := in.c.publish(in.path, in.hash); err != nil {
		return err
	}
	in.c.writeFrames(in.hash, in.c.bundlePath(in.hash))
	if err := in.c.evict(in.hash); err != nil {
		in.c.log.Warn("evict after commit failed", zap.String("bundle", in.hash), zap.Error(err))
	}
	return nil
}

// Abort discards the bundle being received. It is safe to call after Commit (a no-op).
func (in *Incoming) Abort() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.done {
		return
	}
	in.done = true
	in.f.Close()
	os.Remove(in.path)
}

// publish gives a verified temporary file its name. link(2) never replaces: the name appears
// whole or not at all, and if another receiver got there first its copy (identical, since the
// name is the hash) stays, so the inode that other RTEs may have pinned never changes.
func (c *Cache) publish(tmp, hash string) error {
	final := c.bundlePath(hash)
	err := os.Link(tmp, final)
	switch {
	case err == nil, errors.Is(err, fs.ErrExist):
	case c.Has(hash):
	default:
		// A file system without hard links: rename, which is atomic but may replace a copy
		// that appeared since Has looked (identical bytes, so only a pin could notice).
		if rerr := os.Rename(tmp, final); rerr != nil {
			return fmt.Errorf("bundle %s: name it in the cache: %w", hash, rerr)
		}
	}
	os.Remove(tmp)
	c.touch(final)
	return nil
}

// touch records a use, for least-recently-used eviction.
func (c *Cache) touch(p string) {
	now := c.now()
	_ = os.Chtimes(p, now, now) // a failed touch only makes eviction a little less fair
}

// Acquire pins bundles so that no RTE sharing the cache evicts them until release is called.
// A hash need not be in the cache yet: pin a job's bundles before asking for the missing ones,
// so one received for the job cannot be evicted before the job unpacks it. release is safe to
// call more than once.
func (c *Cache) Acquire(hashes ...string) (release func(), err error) {
	var fds []int
	release = sync.OnceFunc(func() {
		for _, fd := range fds {
			unix.Close(fd) // closing drops the flock
		}
	})
	for i, h := range hashes {
		if !protocol.ValidHash(h) {
			release()
			return nil, fmt.Errorf("pin bundle: %q is not sha256: and 64 lowercase hex digits", protocol.PeerText(h, 80))
		}
		if slices.Contains(hashes[:i], h) {
			continue
		}
		fd, err := c.lockShared(h)
		if err != nil {
			release()
			return nil, err
		}
		fds = append(fds, fd)
		c.touch(c.bundlePath(h))
	}
	return release, nil
}

// lockShared takes a shared flock on the bundle's lock file. An evictor unlinks the lock file
// while it holds the exclusive lock, so a shared lock won on an unlinked file pins nothing: the
// path is checked to still be that file, and the lock taken again on the new one if not.
func (c *Cache) lockShared(hash string) (int, error) {
	p := c.lockPath(hash)
	// Each retry means an evictor removed the lock file in between; a handful in a row means
	// something else keeps removing it.
	for range 100 {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return -1, fmt.Errorf("pin bundle %s: open %s: %w", hash, p, err)
		}
		if err := flock(fd, unix.LOCK_SH); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("pin bundle %s: lock %s: %w", hash, p, err)
		}
		if samePath(fd, p) {
			return fd, nil
		}
		unix.Close(fd)
	}
	return -1, fmt.Errorf("pin bundle %s: %s keeps being replaced while it is locked; is something other than an RTE cleaning %s?", hash, p, c.locks)
}

func flock(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// samePath reports whether path still names the file open as fd.
func samePath(fd int, path string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Lstat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// Evict removes least recently used bundles until the cache holds at most MaxBytes, skipping
// any that an RTE has pinned. If pins keep it above MaxBytes it says so in a warning; that is
// not an error, and a later Evict finishes the job once they are released.
func (c *Cache) Evict() error { return c.evict("") }

func (c *Cache) evict(keep string) error {
	c.evictMu.Lock()
	defer c.evictMu.Unlock()
	files, total, err := bundle.Stored(c.bundles)
	if err != nil {
		return fmt.Errorf("evict: %w", err)
	}
	if total <= c.cfg.MaxBytes {
		return nil
	}
	pinned := 0
	for _, f := range files {
		if total <= c.cfg.MaxBytes {
			break
		}
		if f.Name == keep {
			continue
		}
		removed, err := c.remove(f.Name)
		if err != nil {
			return err
		}
		if !removed {
			pinned++
			continue
		}
		total -= f.Size
		c.evictions.Add(1)
		c.log.Debug("evicted bundle", zap.String("bundle", f.Name), zap.Int64("size", f.Size))
	}
	if total > c.cfg.MaxBytes {
		c.log.Warn("bundle cache stays over RTE_CACHE_MB while bundles are in use",
			zap.Int64("bytes", total), zap.Int64("max_bytes", c.cfg.MaxBytes), zap.Int("pinned", pinned))
	}
	return nil
}

// remove evicts one bundle unless it is pinned, reporting whether it is gone. The exclusive
// lock is held while both the bundle and its lock file are unlinked, so no pin can be taken in
// between (see lockShared).
func (c *Cache) remove(hash string) (bool, error) {
	p := c.lockPath(hash)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return false, fmt.Errorf("evict bundle %s: open %s: %w", hash, p, err)
	}
	defer unix.Close(fd)
	if err := flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("evict bundle %s: lock %s: %w", hash, p, err)
	}
	if !samePath(fd, p) {
		return false, nil // another RTE evicted it and a new pin or lock file came since
	}
	if err := os.Remove(c.bundlePath(hash)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("evict bundle %s: %w", hash, err)
	}
	if err := os.Remove(c.framesPath(hash)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, fmt.Errorf("evict bundle %s: remove its frame index: %w", hash, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, fmt.Errorf("evict bundle %s: remove lock file: %w", hash, err)
	}
	return true, nil
}
