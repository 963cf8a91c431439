package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// BundleSource gives the app half the bundles of jobs for runners that take their files from
// the app (RTE_FILES=transfer). Package bundle packs them; the reference app's source packs its
// playbook and inventory directories with a bundle.Packer. Its methods are called from several
// goroutines at once.
type BundleSource interface {
	// Bundles names the bundles of a job submitted without files, packing its directories
	// as needed. It is called once, when the job is dispatched to a runner that takes files
	// from the app, with no lock held; the result is stored with the job, so a job.start sent
	// again names the same bundles. An error ends the job with status error and the error's
	// text, so it says what to do: a directory over RTE_FILES_MAX_MB is mounted on the RTE
	// instead (RTE_FILES=local).
	Bundles(ctx context.Context, j *Job) (*protocol.JobFiles, error)
	// Open returns the bytes of a bundle Bundles named, and their number. An error (the
	// bundle was pruned, say) is sent to the runner in bundle.missing, and the job waiting for
	// it ends with an error there.
	Open(hash string) (io.ReadCloser, int64, error)
}

// SendsFiles reports whether the app has a bundle source (Config.Files), so that jobs for
// runners with RTE_FILES=transfer may be submitted without files.
func (a *App) SendsFiles() bool { return a.cfg.Files != nil }

// maxMissingReason bounds the reason of a bundle.missing.
const maxMissingReason = 500

// transfers are the bundles being sent to one runner over one socket. Each goroutine sends
// one bundle; serve waits for them all before it returns.
type transfers struct {
	wg     sync.WaitGroup
	mu     sync.Mutex
	active map[string]bool // hashes being sent
}

// begin marks hash as being sent and reports whether it was not already.
func (t *transfers) begin(hash string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.active[hash] {
		return false
	}
	if t.active == nil {
		t.active = map[string]bool{}
	}
	t.active[hash] = true
	t.wg.Add(1)
	return true
}

func (t *transfers) end(hash string) {
	t.mu.Lock()
	delete(t.active, hash)
	t.mu.Unlock()
	t.wg.Done()
}

// attachFiles makes sure a queued job for a runner that takes its files from the app names its
// bundles before it is claimed: it asks Config.Files to pack them, outside jobsMu since packing
// may read a large tree, and stores them with the job. ok is false when the job must not be
// claimed now: it is no longer queued for this runner, or it ended because its files could not
// be packed.
func (a *App) attachFiles(ctx context.Context, lv *live, id string) (ok bool, err error) {
	if a.cfg.Files == nil || lv.peer.Hello.Files != protocol.FilesTransfer {
		return true, nil
	}
	j, err := a.cfg.Store.GetJob(ctx, id)
	if err != nil {
		return false, err
	}
	if j.State != JobQueued || j.Start.Files != nil {
		return true, nil // claim decides about a job that changed; one with files is ready
	}
	files, packErr := a.cfg.Files.Bundles(ctx, j)
	if packErr == nil {
		packErr = checkFiles(j, files)
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}

	a.jobsMu.Lock()
	defer a.jobsMu.Unlock()
	j, err = a.cfg.Store.GetJob(ctx, id)
	if err != nil {
		return false, err
	}
	if j.State != JobQueued || j.Runner != lv.peer.Runner {
		return false, nil
	}
	if j.Start.Files != nil {
		return true, nil
	}
	if packErr != nil {
		a.log.Warn("job's files could not be packed; the job ends", zap.String("job", j.ID), zap.String("runner", j.Runner), zap.Error(packErr))
		return false, a.endLocked(ctx, j, protocol.StatusError, "not started: "+protocol.PeerText(packErr.Error(), maxEndMessage))
	}
	j.Start.Files = files
	if err := a.cfg.Store.UpdateJob(ctx, j); err != nil {
		return false, err
	}
	a.log.Info("job's files packed", zap.String("job", j.ID), zap.String("playbooks", files.Playbooks.Hash),
		zap.Int64("playbooks_size", files.Playbooks.Size), zap.Int("inventories", len(files.Inventories)))
	return true, nil
}

// checkFiles holds a BundleSource's answer to the contract, so that a source with a bug ends
// the job here with a clear message instead of at the runner with a refusal.
func checkFiles(j *Job, files *protocol.JobFiles) error {
	if files == nil {
		return errors.New("the app's bundle source named no bundles for the job")
	}
	start := cloneStart(j.Start)
	start.Job = j.ID
	start.Files = files
	if err := start.Validate(); err != nil {
		return fmt.Errorf("the app's bundle source named bad bundles: %w", err)
	}
	return nil
}

// serveBundles answers a runner's bundle.want: each bundle is sent by a goroutine of its own,
// so the runner's other messages are handled meanwhile, and its chunks wait behind the
// socket's control frames. A runner may ask only for bundles of its own jobs; anything else
// is answered bundle.missing, like a bundle the source cannot open.
func (a *App) serveBundles(ctx context.Context, lv *live, m *protocol.BundleWant) {
	log := a.log.With(zap.String("runner", lv.peer.Runner), zap.String("job", m.Job))
	reason := ""
	var allowed []string
	switch j, err := a.cfg.Store.GetJob(ctx, m.Job); {
	case a.cfg.Files == nil:
		reason = "this app does not serve bundles: run the runner with RTE_FILES=local, or use an app that transfers files"
	case errors.Is(err, ErrNotFound), err == nil && j.Runner != lv.peer.Runner:
		reason = fmt.Sprintf("job %q is not a job this app gave runner %q", protocol.PeerText(m.Job, 128), lv.peer.Runner)
	case err != nil:
		reason = "the app could not read the job; ask again later"
		log.Error("bundle.want: reading the job failed", zap.Error(err))
	case j.Start.Files != nil:
		allowed = append([]string{j.Start.Files.Playbooks.Hash}, hashesOf(j.Start.Files.Inventories)...)
	}
	for _, hash := range m.Hashes {
		why := reason
		if why == "" && !slices.Contains(allowed, hash) {
			why = fmt.Sprintf("bundle %s is not one of job %q's bundles", hash, m.Job)
		}
		if why != "" {
			log.Warn("bundle.want refused", zap.String("bundle", hash), zap.String("reason", why))
			_ = lv.peer.Send(ctx, protocol.BundleMissing{Hash: hash, Reason: why})
			continue
		}
		if !lv.transfers.begin(hash) {
			continue // on its way already: the runner gets it from that transfer
		}
		go func() {
			defer lv.transfers.end(hash)
			a.sendBundle(ctx, lv, hash, log)
		}()
	}
}

func hashesOf(refs []protocol.BundleRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.Hash
	}
	return out
}

// sendBundle sends one bundle as chunks of at most protocol.MaxChunkPayload bytes, then
// bundle.end with the bytes sent, both behind any control frames. A bundle that cannot be
// opened or read whole is answered bundle.missing; a socket that ends stops the transfer (the
// runner asks again on its next socket).
func (a *App) sendBundle(ctx context.Context, lv *live, hash string, log *zap.Logger) {
	log = log.With(zap.String("bundle", hash))
	conn := lv.peer.Conn
	missing := func(reason string) {
		log.Warn("bundle not sent", zap.String("reason", reason))
		_ = conn.SendAfterBinary(ctx, protocol.BundleMissing{Hash: hash, Reason: protocol.PeerText(reason, maxMissingReason)})
	}
	raw, err := protocol.ParseHash(hash)
	if err != nil {
		missing(err.Error())
		return
	}
	rc, size, err := a.cfg.Files.Open(hash)
	if err != nil {
		missing(fmt.Sprintf("the app cannot open bundle %s: %v", hash, err))
		return
	}
	defer rc.Close()
	buf := make([]byte, protocol.MaxChunkPayload)
	var sent int64
	for {
		n, rerr := io.ReadFull(rc, buf)
		if n > 0 {
			frame, err := protocol.EncodeChunk(raw, uint64(sent), buf[:n])
			if err != nil {
				missing(err.Error())
				return
			}
			if err := conn.SendBinary(ctx, frame); err != nil {
				return // the socket ended
			}
			sent += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			missing(fmt.Sprintf("the app failed reading bundle %s after %d bytes: %v", hash, sent, rerr))
			return
		}
	}
	if sent != size {
		missing(fmt.Sprintf("bundle %s changed while the app sent it: %d bytes read, %d expected", hash, sent, size))
		return
	}
	if err := conn.SendAfterBinary(ctx, protocol.BundleEnd{Hash: hash, Size: sent}); err != nil {
		return
	}
	log.Info("bundle sent", zap.Int64("size", sent))
}
