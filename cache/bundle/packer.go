package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rte-project/rte/internal/atomicfile"
	"github.com/rte-project/rte/protocol"
)

// racyWindow: a file modified this recently may change again within the same timestamp tick
// without its mtime moving, so a tree holding one is packed but not remembered (git calls this
// the racy-clean problem). It is packed afresh next time, and remembered once it has settled.
const racyWindow = 2 * time.Second

// signatureVersion changes whenever what a signature covers or how Pack encodes changes, so a
// cache directory written by an older build is never trusted for a newer encoding.
const signatureVersion = "rte-bundle-v2 zstd-default tar-fixed-2000 frames-fnv16-64k-1m"

// Packed is a bundle in the Packer's cache directory.
type Packed struct {
	Name string // "sha256:<hex>"
	Size int64  // compressed bytes
	Path string // the file holding the bundle; read it, do not change it
}

// Packer packs directories into bundles kept in a cache directory on disk (<CacheDir>/<hex>.tar.zst),
// and remembers, by a signature of each tree's paths, types, sizes, modes, mtimes and symlink
// targets, which bundle a tree became. A tree whose signature is known is neither read nor
// compressed again: Pack costs one lstat per entry.
//
// A Packer is safe for concurrent use; two calls for the same unchanged tree pack it once. The
// cache directory may be shared by Packers of one app process and survives restarts; it only
// grows, so call Prune.
type Packer struct {
	CacheDir string
	opts     PackOptions
	now      func() time.Time

	mu       sync.Mutex
	inflight map[string]*flight
	// indexes keeps each bundle's frame index once read: a bundle never changes under its
	// name, and the app asks for an index on every transfer of it, to every runner.
	indexes map[string][]protocol.BundleFrame
}

type flight struct {
	done chan struct{}
	res  Packed
	err  error
}

// NewPacker makes cacheDir (0700) if needed and returns a Packer that packs with opts.
func NewPacker(cacheDir string, opts PackOptions) (*Packer, error) {
	if cacheDir == "" {
		return nil, errors.New("bundle packer: the cache directory is required")
	}
	if err := os.MkdirAll(filepath.Join(cacheDir, "trees"), 0o700); err != nil {
		return nil, fmt.Errorf("bundle packer: make cache directory %s: %w", cacheDir, err)
	}
	return &Packer{CacheDir: cacheDir, opts: opts, now: time.Now, inflight: make(map[string]*flight)}, nil
}

// Pack returns the bundle of dir, packing it only when the tree changed since it was last
// packed. The errors are Pack's (including *TooLargeError and *UnsafeEntryError).
func (p *Packer) Pack(ctx context.Context, dir string) (Packed, error) {
	root, err := resolveRoot(dir)
	if err != nil {
		return Packed{}, err
	}
	for {
		start := p.now()
		entries, err := scan(ctx, root, p.opts)
		if err != nil {
			return Packed{}, err
		}
		key := signature(entries)
		if res, ok := p.lookup(key); ok {
			return res, nil
		}
		p.mu.Lock()
		if f, ok := p.inflight[key]; ok {
			p.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return Packed{}, ctx.Err()
			}
			if f.err != nil && (errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded)) {
				continue // the packing caller gave up; this one has not
			}
			return f.res, f.err
		}
		f := &flight{done: make(chan struct{})}
		p.inflight[key] = f
		p.mu.Unlock()

		f.res, f.err = p.pack(ctx, root, entries, key, start)
		p.mu.Lock()
		delete(p.inflight, key)
		p.mu.Unlock()
		close(f.done)
		return f.res, f.err
	}
}

func (p *Packer) bundlePath(name string) string { return FilePath(p.CacheDir, name) }

func (p *Packer) treePath(key string) string { return filepath.Join(p.CacheDir, "trees", key) }

// lookup finds the bundle a tree signature was packed into, if it is still in the cache.
func (p *Packer) lookup(key string) (Packed, bool) {
	b, err := os.ReadFile(p.treePath(key))
	if err != nil {
		return Packed{}, false
	}
	name, sizeText, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	size, err := strconv.ParseInt(sizeText, 10, 64)
	if !ok || err != nil || !protocol.ValidHash(name) {
		return Packed{}, false
	}
	res := Packed{Name: name, Size: size, Path: p.bundlePath(name)}
	fi, err := os.Stat(res.Path)
	if err != nil || fi.Size() != size {
		return Packed{}, false
	}
	now := p.now()
	_ = os.Chtimes(res.Path, now, now) // for Prune's least-recently-used order; harmless if it fails
	return res, true
}

func (p *Packer) pack(ctx context.Context, root string, entries []entry, key string, start time.Time) (Packed, error) {
	tmp, err := os.CreateTemp(p.CacheDir, ".pack-*")
	if err != nil {
		return Packed{}, fmt.Errorf("bundle packer: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	name, size, _, err := writeBundle(ctx, root, entries, tmp)
	if err == nil {
		// Synced before it is named: the app trusts a named bundle without reading it again,
		// and a torn one would fail every job that uses it.
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return Packed{}, err
	}
	res := Packed{Name: name, Size: size, Path: p.bundlePath(name)}
	if err := os.Rename(tmp.Name(), res.Path); err != nil {
		return Packed{}, fmt.Errorf("bundle packer: %w", err)
	}
	if racy(entries, start) {
		return res, nil
	}
	if err := atomicfile.WriteFile(p.treePath(key), fmt.Appendf(nil, "%s %d\n", name, size), 0o600); err != nil {
		return Packed{}, fmt.Errorf("bundle packer: remember %s: %w", root, err)
	}
	return res, nil
}

func racy(entries []entry, start time.Time) bool {
	limit := start.Add(-racyWindow).UnixNano()
	for _, e := range entries {
		if e.mtime >= limit {
			return true
		}
	}
	return false
}

// signature is the hex sha256 of everything that decides a tree's bundle without reading its
// files: each entry's path, type, permission bits, size, mtime and symlink target, in order.
func signature(entries []entry) string {
	h := sha256.New()
	h.Write([]byte(signatureVersion))
	var num [8]byte
	for _, e := range entries {
		h.Write([]byte{0})
		h.Write([]byte(e.rel))
		h.Write([]byte{0})
		binary.BigEndian.PutUint64(num[:], uint64(e.mode))
		h.Write(num[:])
		binary.BigEndian.PutUint64(num[:], uint64(e.size))
		h.Write(num[:])
		binary.BigEndian.PutUint64(num[:], uint64(e.mtime))
		h.Write(num[:])
		h.Write([]byte(e.target))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Prune removes the least recently used bundles of the cache directory until what remains
// holds at most maxBytes, and forgets the trees that were packed into them. A bundle being
// sent keeps its open file readable after it is removed.
func (p *Packer) Prune(maxBytes int64) error {
	files, total, err := Stored(p.CacheDir)
	if err != nil {
		return fmt.Errorf("bundle packer: %w", err)
	}
	removed := false
	for _, f := range files {
		if total <= maxBytes {
			break
		}
		if err := os.Remove(p.bundlePath(f.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("bundle packer: %w", err)
		}
		p.mu.Lock()
		delete(p.indexes, f.Name)
		p.mu.Unlock()
		total -= f.Size
		removed = true
	}
	if removed {
		p.forgetMissing()
	}
	return nil
}

// forgetMissing drops tree records whose bundle is gone; lookup would ignore them anyway.
func (p *Packer) forgetMissing() {
	ents, err := os.ReadDir(filepath.Join(p.CacheDir, "trees"))
	if err != nil {
		return
	}
	for _, e := range ents {
		if _, ok := p.lookupNoTouch(e.Name()); !ok && !strings.HasPrefix(e.Name(), ".") {
			_ = os.Remove(p.treePath(e.Name()))
		}
	}
}

func (p *Packer) lookupNoTouch(key string) (string, bool) {
	b, err := os.ReadFile(p.treePath(key))
	if err != nil {
		return "", false
	}
	name, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	if !protocol.ValidHash(name) {
		return "", false
	}
	_, err = os.Stat(p.bundlePath(name))
	return name, err == nil
}

// Index returns the frame index of a bundle in the cache directory, as bundle.frames carries
// it: each zstd frame's size and SHA-256, in order, at most protocol.MaxBundleFrames of them.
// It reads the bundle once (ScanFrames) and decompresses nothing.
func (p *Packer) Index(name string) ([]protocol.BundleFrame, error) {
	if !protocol.ValidHash(name) {
		return nil, fmt.Errorf("bundle packer: %q is not a bundle name", protocol.PeerText(name, 80))
	}
	p.mu.Lock()
	known, ok := p.indexes[name]
	p.mu.Unlock()
	if ok {
		return slices.Clone(known), nil
	}
	f, err := os.Open(p.bundlePath(name))
	if err != nil {
		return nil, fmt.Errorf("bundle packer: %w", err)
	}
	defer f.Close()
	frames, err := ScanFrames(f, protocol.MaxBundleFrames)
	if err != nil {
		return nil, fmt.Errorf("bundle packer: bundle %s: %w", name, err)
	}
	out := make([]protocol.BundleFrame, len(frames))
	for i, fr := range frames {
		out[i] = protocol.BundleFrame{Size: fr.Size, SHA256: hex.EncodeToString(fr.Hash[:])}
	}
	p.mu.Lock()
	if p.indexes == nil {
		p.indexes = map[string][]protocol.BundleFrame{}
	}
	p.indexes[name] = out
	p.mu.Unlock()
	return slices.Clone(out), nil
}
