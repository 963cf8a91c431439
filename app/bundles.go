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

// BundleIndexer is a BundleSource that can give a bundle's frame index (protocol feature
// bundle.frames), so that a runner holding an older bundle of the same directory fetches only
// the frames that changed. bundle.Packer.Index gives it for the bundles it packed. A source
// that does not implement it sends every bundle whole.
type BundleIndexer interface {
	// Index returns the zstd frames of a bundle Bundles named, in order, at most
	// protocol.MaxBundleFrames of them.
	Index(hash string) ([]protocol.BundleFrame, error)
}

// features are the protocol additions this app names in welcome.
func (a *App) features() []string {
	if _, ok := a.cfg.Files.(BundleIndexer); ok && !a.cfg.NoBundleFrames {
		return []string{protocol.FeatureBundleFrames}
	}
	return nil
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
	active map[string]*sending // bundles being sent, by hash
	// indexed holds the bundles whose frame index was sent, by hash, with their size: the
	// runner's bundle.ranges for one of them is answered once.
	indexed map[string]int64
}

func (t *transfers) setIndexed(hash string, size int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.indexed == nil {
		t.indexed = map[string]int64{}
	}
	t.indexed[hash] = size
}

// takeIndexed forgets that hash's index was sent and returns its size, if it was.
func (t *transfers) takeIndexed(hash string) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	size, ok := t.indexed[hash]
	delete(t.indexed, hash)
	return size, ok
}

// sending is one bundle being sent to the runner, from begin to end.
type sending struct {
	t    *transfers
	hash string
	once sync.Once
}

// begin marks hash as being sent and returns the mark, or nil if it is being sent already.
func (t *transfers) begin(hash string) *sending {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.active[hash] != nil {
		return nil
	}
	if t.active == nil {
		t.active = map[string]*sending{}
	}
	s := &sending{t: t, hash: hash}
	t.active[hash] = s
	t.wg.Add(1)
	return s
}

// release unmarks the bundle before the message that ends its stream is queued (bundle.end,
// bundle.missing, bundle.frames): the runner may answer that message at once with a new
// bundle.want or bundle.ranges for the same bundle, which must not find it still marked and
// be dropped as "on its way already".
func (s *sending) release() {
	s.once.Do(func() {
		s.t.mu.Lock()
		if s.t.active[s.hash] == s {
			delete(s.t.active, s.hash)
		}
		s.t.mu.Unlock()
	})
}

// end releases the mark, if that was not done, when the sending goroutine returns.
func (s *sending) end() {
	s.release()
	s.t.wg.Done()
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
		mark := lv.transfers.begin(hash)
		if mark == nil {
			continue // on its way already: the runner gets it from that transfer
		}
		byFrames := slices.Contains(m.Frames, hash)
		go func() {
			defer mark.end()
			if byFrames && a.sendIndex(ctx, lv, mark, log) {
				return
			}
			a.sendBundle(ctx, lv, mark, nil, log)
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

// sendIndex answers a bundle.want that asked for the bundle's frames with bundle.frames, and
// reports whether it did; false sends the bundle whole instead (a source without an index).
func (a *App) sendIndex(ctx context.Context, lv *live, mark *sending, log *zap.Logger) bool {
	hash := mark.hash
	ix, ok := a.cfg.Files.(BundleIndexer)
	if !ok || a.cfg.NoBundleFrames {
		return false
	}
	frames, err := ix.Index(hash)
	if err != nil {
		log.Info("no frame index for the bundle; it is sent whole", zap.String("bundle", hash), zap.Error(err))
		return false
	}
	var size int64
	for _, f := range frames {
		size += f.Size
	}
	m := protocol.BundleFrames{Hash: hash, Size: size, Frames: frames}
	if err := m.Validate(); err != nil {
		log.Warn("the bundle source's frame index is not valid; the bundle is sent whole", zap.String("bundle", hash), zap.Error(err))
		return false
	}
	// Recorded before it is sent, so the runner's bundle.ranges always finds it.
	lv.transfers.setIndexed(hash, size)
	mark.release()
	if err := lv.peer.Conn.SendAfterBinary(ctx, m); err != nil {
		lv.transfers.takeIndexed(hash)
		return true // the socket ended; the runner asks again on its next one
	}
	log.Info("bundle frame index sent", zap.String("bundle", hash), zap.Int("frames", len(frames)))
	return true
}

// serveRanges answers a runner's bundle.ranges, which must follow the bundle.frames this app
// sent for the bundle on this socket: the chunks of those ranges, then bundle.end. A range
// past the bundle is answered bundle.missing, and the runner's job ends with an error.
func (a *App) serveRanges(ctx context.Context, lv *live, m *protocol.BundleRanges) {
	log := a.log.With(zap.String("runner", lv.peer.Runner), zap.String("job", m.Job))
	size, ok := lv.transfers.takeIndexed(m.Hash)
	if !ok {
		_ = lv.peer.Conn.ReportBad(ctx, protocol.Error{Code: protocol.ErrUnexpected, Ref: m.Hash,
			Message: fmt.Sprintf("bundle.ranges for bundle %s, whose frame index this app did not send on this socket", m.Hash)})
		return
	}
	if n := len(m.Ranges); n > 0 && m.Ranges[n-1].Offset+m.Ranges[n-1].Size > size {
		why := fmt.Sprintf("bundle.ranges asks for bytes up to %d of bundle %s, which has %d", m.Ranges[n-1].Offset+m.Ranges[n-1].Size, m.Hash, size)
		log.Warn("bundle.ranges refused", zap.String("bundle", m.Hash), zap.String("reason", why))
		_ = lv.peer.Conn.SendAfterBinary(ctx, protocol.BundleMissing{Hash: m.Hash, Reason: why})
		return
	}
	mark := lv.transfers.begin(m.Hash)
	if mark == nil {
		return // on its way already, whole
	}
	go func() {
		defer mark.end()
		a.sendBundle(ctx, lv, mark, m.Ranges, log)
	}()
}

// sendBundle sends one bundle, or only the given ranges of it, as chunks of at most
// protocol.MaxChunkPayload bytes, then bundle.end with the bundle's size, both behind any
// control frames. A bundle that cannot be opened or read whole is answered bundle.missing; a
// socket that ends stops the transfer (the runner asks again on its next socket).
func (a *App) sendBundle(ctx context.Context, lv *live, mark *sending, ranges []protocol.ByteRange, log *zap.Logger) {
	hash := mark.hash
	log = log.With(zap.String("bundle", hash))
	conn := lv.peer.Conn
	missing := func(reason string) {
		log.Warn("bundle not sent", zap.String("reason", reason))
		mark.release()
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
	if ranges == nil {
		ranges = []protocol.ByteRange{{Offset: 0, Size: size}}
	}
	buf := make([]byte, protocol.MaxChunkPayload)
	var pos, sent int64 // pos: the next byte rc gives
	for _, r := range ranges {
		if r.Offset+r.Size > size {
			missing(fmt.Sprintf("bundle %s changed since its index was sent: it has %d bytes, the range asked for ends at %d", hash, size, r.Offset+r.Size))
			return
		}
		if err := skipTo(rc, pos, r.Offset); err != nil {
			missing(fmt.Sprintf("the app failed reading bundle %s at %d: %v", hash, r.Offset, err))
			return
		}
		pos = r.Offset
		for left := r.Size; left > 0; {
			n, rerr := io.ReadFull(rc, buf[:min(left, int64(len(buf)))])
			if n > 0 {
				frame, err := protocol.EncodeChunk(raw, uint64(pos), buf[:n])
				if err != nil {
					missing(err.Error())
					return
				}
				if err := conn.SendBinary(ctx, frame); err != nil {
					return // the socket ended
				}
				pos += int64(n)
				sent += int64(n)
				left -= int64(n)
			}
			if rerr != nil && left > 0 {
				missing(fmt.Sprintf("the app failed reading bundle %s after %d bytes: %v", hash, pos, rerr))
				return
			}
		}
	}
	// A whole bundle is read to its end, so one that grew since it was opened is caught.
	if len(ranges) == 1 && ranges[0].Offset == 0 && ranges[0].Size == size {
		if n, _ := rc.Read(buf[:1]); n > 0 {
			missing(fmt.Sprintf("bundle %s changed while the app sent it: more than the %d bytes expected", hash, size))
			return
		}
	}
	mark.release()
	if err := conn.SendAfterBinary(ctx, protocol.BundleEnd{Hash: hash, Size: size}); err != nil {
		return
	}
	log.Info("bundle sent", zap.Int64("size", size), zap.Int64("bytes_sent", sent))
}

// skipTo moves r, at byte pos, forward to byte off: by seeking when it can, else by reading.
func skipTo(r io.Reader, pos, off int64) error {
	if off == pos {
		return nil
	}
	if s, ok := r.(io.Seeker); ok {
		_, err := s.Seek(off, io.SeekStart)
		return err
	}
	_, err := io.CopyN(io.Discard, r, off-pos)
	return err
}
