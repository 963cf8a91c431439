package rte

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/rte-project/rte/cache"
	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/session"
)

// fileSource is where jobs get their files: the directories ANSIBLE_PATH and REPO_PATH
// (RTE_FILES=local), or bundles the app sends into the cache (RTE_FILES=transfer). It is the
// jobs package's Preparer in both modes.
type fileSource struct {
	local jobs.LocalFiles
	cache *cache.Cache // nil in local mode
	// fetch asks the app for bundles: the session Manager, which is built after the jobs
	// Manager that uses this, and set before the first socket can bring a job.
	fetch interface {
		Fetch(ctx context.Context, job string, refs []protocol.BundleRef) error
	}
	log *zap.Logger
}

func newFileSource(s *config.Settings, logger *zap.Logger) (*fileSource, error) {
	f := &fileSource{log: logger.Named("files")}
	if s.Files == protocol.FilesLocal {
		f.local = jobs.LocalFiles{AnsiblePath: s.AnsiblePath, RepoPath: s.RepoPath}
		return f, nil
	}
	c, err := cache.Open(cache.Config{
		Dir:        s.CachePath,
		MaxBytes:   s.CacheBytes(),
		Owner:      cache.NewOwner(Hostname()),
		Logger:     logger,
		StaleAfter: s.CacheStaleAfter,
	})
	if err != nil {
		return nil, fmt.Errorf("open the bundle cache (RTE_CACHE_PATH): %w", err)
	}
	f.cache = c
	return f, nil
}

// workDir is where the jobs package makes job directories. In transfer mode that is the
// cache's directory of this RTE, so that when this RTE is killed, another RTE sharing the
// cache removes its job directories (secret files included) once it has gone silent.
func (f *fileSource) workDir(local string) string {
	if f.cache == nil {
		return local
	}
	return f.cache.JobsDir()
}

// bundles is what the session fills: the cache in transfer mode, nil in local mode.
func (f *fileSource) bundles() session.BundleStore {
	if f.cache == nil {
		return nil
	}
	return bundleStore{f.cache}
}

// run heartbeats the cache and sweeps the directories of RTEs that stopped, until ctx is done.
func (f *fileSource) run(ctx context.Context) {
	if f.cache == nil {
		return
	}
	_ = f.cache.Run(ctx) // logs its own failures and returns nil
}

// Validate refuses a job whose files this RTE cannot take: paths in local mode, bundles that
// cannot fit in the cache (files_too_large) or bad paths in transfer mode.
func (f *fileSource) Validate(js *protocol.JobStart) error {
	if f.cache == nil {
		return f.local.Validate(js)
	}
	err := f.cache.Validate(js)
	var tl *cache.TooLargeError
	if errors.As(err, &tl) {
		return &jobs.Refusal{Code: protocol.RefusedFilesTooLarge, Message: tl.Error()}
	}
	return err
}

// Prepare makes the job's files ready in dir. In transfer mode it pins the job's bundles, asks
// the app for those the cache lacks and waits for them, unpacks them, and unpins them: the
// unpacked job no longer reads them. A bundle that turns out never to unpack is discarded.
func (f *fileSource) Prepare(ctx context.Context, js *protocol.JobStart, dir string) (jobs.Workspace, error) {
	if f.cache == nil {
		return f.local.Prepare(ctx, js, dir)
	}
	if js.Files == nil {
		return jobs.Workspace{}, f.cache.Validate(js) // names the missing files
	}
	refs := append([]protocol.BundleRef{js.Files.Playbooks}, js.Files.Inventories...)
	hashes := make([]string, len(refs))
	for i, r := range refs {
		hashes[i] = r.Hash
	}
	// Pinned before asking, so a bundle received for this job is not evicted before it is
	// unpacked, by this RTE or another sharing the cache.
	release, err := f.cache.Acquire(hashes...)
	if err != nil {
		return jobs.Workspace{}, err
	}
	ws, err := f.fetchAndUnpack(ctx, js, dir, refs)
	release()
	var bad *cache.BadBundleError
	if errors.As(err, &bad) {
		gone, derr := f.cache.Discard(bad.Hash)
		f.log.Warn("bundle refused when unpacking; the job ends with an error", zap.String("job", js.Job),
			zap.String("bundle", bad.Hash), zap.Bool("discarded", gone), zap.Error(errors.Join(bad, derr)))
	}
	return ws, err
}

func (f *fileSource) fetchAndUnpack(ctx context.Context, js *protocol.JobStart, dir string, refs []protocol.BundleRef) (jobs.Workspace, error) {
	if f.fetch == nil {
		return jobs.Workspace{}, errors.New("the RTE is still starting and cannot ask the app for bundles yet")
	}
	if err := f.fetch.Fetch(ctx, js.Job, refs); err != nil {
		return jobs.Workspace{}, err
	}
	ws, err := f.cache.Prepare(ctx, js, dir)
	if err != nil {
		return jobs.Workspace{}, err
	}
	return jobs.Workspace{Dir: ws.Dir, Playbook: ws.Playbook, Inventories: ws.Inventories, Release: ws.Release}, nil
}

// bundleStore is the cache as the session sees it.
type bundleStore struct{ *cache.Cache }

func (b bundleStore) Receive(hash string, size int64) (session.BundleReceiver, error) {
	in, err := b.Cache.Receive(hash, size)
	if err != nil {
		return nil, err
	}
	return in, nil
}
