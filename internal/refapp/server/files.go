package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/pgstore"
	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/internal/refapp/settings"
	"github.com/rte-project/rte/protocol"
)

// BundleSource sends runners with RTE_FILES=transfer the app's own copy of the playbooks
// (APP_PLAYBOOKS_PATH) and of the inventories (APP_INVENTORY_PATH), packed with bundle.Packer
// into a cache directory beside the database. An unchanged directory is neither read nor
// compressed again, and keeps its bundle's name, so a runner fetches it once.
type BundleSource struct {
	playbooks string // APP_PLAYBOOKS_PATH
	inventory string // APP_INVENTORY_PATH; "" sends no inventory bundle
	cacheDir  string
	// maxBytes is RTE_FILES_MAX_MB in bytes, asked for every job, so a job never goes out
	// under a limit that no longer holds.
	maxBytes func() int64
	// keepBytes bounds the cache directory (APP_BUNDLE_CACHE_MB); it is pruned after each pack.
	keepBytes int64
	log       *zap.Logger

	mu      sync.Mutex
	packers map[int64]*bundle.Packer // by size limit; they share cacheDir
}

// packCacheDir is the bundle cache beside the database: rte-app.db gets rte-app-bundles. With
// PostgreSQL it is rte-app-bundles in the working directory; each node keeps its own.
func packCacheDir(db string) string {
	if pgstore.IsURL(db) {
		return "rte-app-bundles" // no file to sit beside: the working directory
	}
	return strings.TrimSuffix(db, filepath.Ext(db)) + "-bundles"
}

// NewBundleSource returns the source for s, or nil when APP_PLAYBOOKS_PATH is unset: then the
// app sends no files, and transfer-mode runners are refused at submission.
func NewBundleSource(s *settings.Settings, logger *zap.Logger) (*BundleSource, error) {
	if s.PlaybooksPath == "" {
		return nil, nil
	}
	src := &BundleSource{
		playbooks: s.PlaybooksPath,
		inventory: s.InventoryPath,
		cacheDir:  packCacheDir(s.DB),
		maxBytes:  func() int64 { return int64(s.FilesMaxMB) << 20 },
		keepBytes: int64(s.BundleCacheMB) << 20,
		log:       logger.Named("bundles"),
		packers:   map[int64]*bundle.Packer{},
	}
	if err := os.MkdirAll(src.cacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("make the bundle cache %s (next to APP_DB): %w", src.cacheDir, err)
	}
	return src, nil
}

func (b *BundleSource) packer() (*bundle.Packer, error) {
	limit := b.maxBytes()
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.packers[limit]; p != nil {
		return p, nil
	}
	p, err := bundle.NewPacker(b.cacheDir, bundle.PackOptions{MaxBytes: limit})
	if err != nil {
		return nil, err
	}
	b.packers[limit] = p
	return p, nil
}

// Bundles packs the playbook directory and, when set, the inventory directory. A directory
// over RTE_FILES_MAX_MB fails the job with bundle.TooLargeError's advice to mount it on the
// RTE instead.
func (b *BundleSource) Bundles(ctx context.Context, j *app.Job) (*protocol.JobFiles, error) {
	p, err := b.packer()
	if err != nil {
		return nil, err
	}
	pb, err := packSettled(ctx, func() (bundle.Packed, error) { return p.Pack(ctx, b.playbooks) })
	if err != nil {
		return nil, fmt.Errorf("pack the playbooks (APP_PLAYBOOKS_PATH): %w", err)
	}
	files := &protocol.JobFiles{Playbooks: protocol.BundleRef{Hash: pb.Name, Size: pb.Size}}
	if b.inventory != "" {
		inv, err := packSettled(ctx, func() (bundle.Packed, error) { return p.Pack(ctx, b.inventory) })
		if err != nil {
			return nil, fmt.Errorf("pack the inventories (APP_INVENTORY_PATH): %w", err)
		}
		files.Inventories = []protocol.BundleRef{{Hash: inv.Name, Size: inv.Size}}
	}
	// The bundles just packed or looked up are the most recently used, so pruning keeps them.
	if err := p.Prune(b.keepBytes); err != nil {
		b.log.Warn("pruning the bundle cache failed; it is tried again with the next job", zap.String("dir", b.cacheDir), zap.Error(err))
	}
	return files, nil
}

// packTries and packPause bound packSettled: a file being written (a deploy, an editor's save)
// is done within moments, so a few tries over about three seconds let the job go out instead of
// ending it with an error (seen by the chaos harness, which rewrites a file while jobs start).
var (
	packTries = 6
	packPause = 100 * time.Millisecond
)

// packSettled calls pack until it does not fail with bundle.ChangedError, pausing between
// tries (doubling from packPause), at most packTries times.
func packSettled(ctx context.Context, pack func() (bundle.Packed, error)) (bundle.Packed, error) {
	pause := packPause
	for try := 1; ; try++ {
		pb, err := pack()
		var changed *bundle.ChangedError
		if !errors.As(err, &changed) || try == packTries {
			return pb, err
		}
		select {
		case <-ctx.Done():
			return pb, err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// Open reads a bundle from the cache directory. A bundle pruned since its job was dispatched
// is gone; the runner hears why and the job ends with an error.
func (b *BundleSource) Open(hash string) (io.ReadCloser, int64, error) {
	if !protocol.ValidHash(hash) {
		return nil, 0, fmt.Errorf("%q is not a bundle name", hash)
	}
	f, err := os.Open(filepath.Join(b.cacheDir, strings.TrimPrefix(hash, "sha256:")+".tar.zst"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, fmt.Errorf("bundle %s is no longer in the app's bundle cache (APP_BUNDLE_CACHE_MB may be too small for the jobs in flight); submit the job again", hash)
	}
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// Index gives a packed bundle's frame index (app.BundleIndexer), so a runner that holds an
// older bundle of the same directory fetches only the frames that changed.
func (b *BundleSource) Index(hash string) ([]protocol.BundleFrame, error) {
	p, err := b.packer()
	if err != nil {
		return nil, err
	}
	return p.Index(hash)
}

// SetInventory replaces APP_INVENTORY_PATH's directory. It is not safe once jobs run: the demo
// calls it before its RTE starts, when it has written the inventory of its own sshd.
func (b *BundleSource) SetInventory(dir string) { b.inventory = dir }

// FilesConfig is what app.Config.Files gets: nil stays a nil interface.
func (b *BundleSource) FilesConfig() app.BundleSource {
	if b == nil {
		return nil
	}
	return b
}
