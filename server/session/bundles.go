package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// BundleStore is what a session needs of the RTE's bundle cache (RTE_FILES=transfer): which
// bundles it lacks, and somewhere to receive one. Package cache provides it; internal/rte adapts.
// Its methods are called from job goroutines (Fetch) and from the socket's reader at once.
type BundleStore interface {
	// Missing returns, in order and without repeats, those of hashes the store lacks.
	Missing(hashes []string) []string
	// Receive starts receiving the bundle named hash, announced as size bytes, into a
	// temporary place of its own.
	Receive(hash string, size int64) (BundleReceiver, error)
}

// BundleReceiver is one bundle being received. WriteAt and Commit may come from different
// goroutines, never after Commit or Abort.
type BundleReceiver interface {
	// WriteAt stores one chunk at its offset; a chunk past the announced size is an error.
	WriteAt(p []byte, off int64) (int, error)
	// Commit checks that the bundle has size bytes and hashes to its name and gives it its
	// name; a bundle that does not match is discarded with an error naming it.
	Commit(size int64) error
	// Abort discards what was received; safe after Commit.
	Abort()
}

// FrameFiller is a BundleReceiver that can copy, from bundles the store already holds, the
// frames of the bundle it receives (protocol feature bundle.frames); *cache.Incoming is one.
type FrameFiller interface {
	// Fill takes the app's frame index, copies each frame the store holds to its offset, and
	// returns the byte ranges still to be received and the bytes it filled. Commit verifies
	// the whole bundle afterwards as for any other.
	Fill(frames []protocol.BundleFrame) (missing []protocol.ByteRange, filled int64, err error)
}

// maxMissingReason bounds the app's bundle.missing reason in a job's end message.
const maxMissingReason = 300

// Results of rte_bundles_received_total.
const (
	bundleOK        = "ok"
	bundleDiscarded = "discarded"
	bundleMissing   = "missing"
)

// transfers are the bundles jobs wait for, by hash, shared by every socket of the Manager: a
// bundle that two jobs need is asked for once, and a socket that drops mid-transfer hands the
// waiting jobs to the next socket, which asks again from the start.
type transfers struct {
	mu sync.Mutex
	// byHash holds the pending transfers: asked for, or waiting for a socket to ask on.
	byHash map[string]*transfer
	// draining names the bundles whose transfer ended early (a chunk failed, or another
	// socket's copy arrived first) while the app may still be sending them on the named
	// socket. The rest of that stream is dropped quietly until its bundle.end or
	// bundle.missing, and the bundle is asked for again on that socket only after it, so
	// that two streams of one bundle never mix.
	draining map[string]*session
}

// transfer is one bundle asked for, or waiting to be asked for. It is pending while done is
// open, and settled once done is closed (err says how).
type transfer struct {
	hash    string
	size    int64
	waiters map[string]int // job -> Fetch calls waiting for it

	sess *session       // the socket it was asked on; nil until asked
	recv BundleReceiver // where its chunks go on sess
	job  string         // the job its bundle.want on sess named; waiters may since have left

	// framesAsked: the bundle.want on sess asked for its frame index; bundle.frames is
	// expected (or the whole bundle, from an app that cannot index it).
	framesAsked bool
	// filled: bytes of the bundle being received came from frames the store held. If the
	// bundle then fails its hash, it is asked for once more, whole (whole set), instead of
	// failing the jobs: a cached frame or the app's index may be wrong, the bundle not.
	filled bool
	whole  bool

	done chan struct{}
	err  error // set before done is closed
}

// drainLocked forgets t, whose stream on t.sess may go on, and drops the rest of that stream.
// The caller holds b.mu.
func (b *transfers) drainLocked(t *transfer) {
	if t.recv != nil {
		t.recv.Abort()
	}
	if b.byHash[t.hash] == t {
		delete(b.byHash, t.hash)
	}
	if t.sess != nil && !t.sess.ended() {
		if b.draining == nil {
			b.draining = map[string]*session{}
		}
		b.draining[t.hash] = t.sess
	}
}

func (t *transfer) settled() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// settle ends the wait of every job waiting for t; only the first call counts. The caller
// holds transfers.mu.
func (t *transfer) settle(err error) {
	if t.settled() {
		return
	}
	t.err = err
	close(t.done)
}

// anyWaiter is the job a bundle.want names for t: the first waiting job in id order, so that
// a retry names the same job as before when it can.
func (t *transfer) anyWaiter() string {
	jobs := make([]string, 0, len(t.waiters))
	for j := range t.waiters {
		jobs = append(jobs, j)
	}
	slices.Sort(jobs)
	return jobs[0]
}

// Fetch blocks until every bundle in refs is in the BundleStore, or ctx ends. It asks the app
// with bundle.want, on the current socket once the app has welcomed and approved it, for only
// the hashes the store lacks and no other job is already waiting for; it asks again on every
// new socket while it still waits, from the first byte, since a dropped socket loses the
// chunks in flight. Each chunk is written at its offset as it arrives, and at bundle.end the
// store checks size and hash before the bundle gets its name.
//
// It returns an error naming the bundle when the app has none to send (bundle.missing, with
// the app's reason), when a chunk cannot be written, or when the bundle does not match its
// size or name (the store discards it), and ctx's cause when ctx ends first. A job that stops
// waiting does not stop a transfer other jobs wait for, nor one already on the wire: the
// bundle is still received and kept, since the app sends it whole either way.
//
// Fetch is safe for concurrent use. Without Config.Bundles it returns an error at once.
func (m *Manager) Fetch(ctx context.Context, job string, refs []protocol.BundleRef) error {
	store := m.cfg.Bundles
	if store == nil {
		return errors.New("this RTE receives no bundles (no bundle cache; RTE_FILES=local): send playbook and inventories as paths")
	}
	waiting, err := m.bundles.join(store, job, refs)
	if err != nil || len(waiting) == 0 {
		return err
	}
	defer m.bundles.leave(job, waiting)
	m.mu.Lock()
	cur := m.current
	m.mu.Unlock()
	m.askForBundles(cur)
	for _, t := range waiting {
		select {
		case <-t.done:
			if t.err != nil {
				return t.err
			}
		case <-ctx.Done():
			return fmt.Errorf("stopped waiting for bundle %s: %w", t.hash, context.Cause(ctx))
		}
	}
	return nil
}

// join registers job as waiting for each bundle of refs the store lacks and returns those
// transfers. A bundle another job already waits for is shared, not asked for twice.
func (b *transfers) join(store BundleStore, job string, refs []protocol.BundleRef) ([]*transfer, error) {
	seen := map[string]int64{}
	for _, r := range refs {
		if !protocol.ValidHash(r.Hash) {
			return nil, fmt.Errorf("bundle %q: not sha256: and 64 lowercase hex digits", protocol.PeerText(r.Hash, 80))
		}
		if size, ok := seen[r.Hash]; ok && size != r.Size {
			return nil, fmt.Errorf("bundle %s is named twice, with sizes %d and %d: the app's job.start is wrong", r.Hash, size, r.Size)
		}
		seen[r.Hash] = r.Size
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byHash == nil {
		b.byHash = map[string]*transfer{}
	}
	var out []*transfer
	for _, r := range refs {
		if slices.ContainsFunc(out, func(t *transfer) bool { return t.hash == r.Hash }) {
			continue
		}
		t := b.byHash[r.Hash]
		if t == nil {
			// Asked under the lock: a transfer that ended well named its bundle before it
			// left byHash, so a bundle just received is never asked for again.
			if len(store.Missing([]string{r.Hash})) == 0 {
				continue
			}
			t = &transfer{hash: r.Hash, size: r.Size, waiters: map[string]int{}, done: make(chan struct{})}
			b.byHash[r.Hash] = t
		}
		t.waiters[job]++
		out = append(out, t)
	}
	return out, nil
}

// leave drops job from the transfers it waited for. A transfer nobody waits for any more is
// forgotten if it was never asked for or its socket has ended; one on a live socket carries on.
func (b *transfers) leave(job string, ts []*transfer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range ts {
		if t.waiters[job]--; t.waiters[job] <= 0 {
			delete(t.waiters, job)
		}
		if len(t.waiters) > 0 || b.byHash[t.hash] != t {
			continue
		}
		if t.sess != nil && !t.sess.ended() {
			continue
		}
		if t.recv != nil {
			t.recv.Abort()
		}
		delete(b.byHash, t.hash)
	}
}

// askForBundles asks the app, on s, for every bundle that jobs wait for and that was not asked
// for on s yet: new transfers, and those asked on an earlier socket, whose partial data is
// discarded. It does nothing until s is welcomed and approved; the welcome and the approval
// call it again. It blocks until the bundle.want messages are queued or s ends.
func (m *Manager) askForBundles(s *session) {
	store := m.cfg.Bundles
	if s == nil || store == nil || !s.isWelcomed.Load() || !s.approved.Load() {
		return
	}
	wants := map[string][]string{}  // job -> hashes
	frames := map[string][]string{} // job -> hashes whose frame index is asked for
	b := &m.bundles
	b.mu.Lock()
	for hash, ds := range b.draining {
		if ds.ended() {
			delete(b.draining, hash)
		}
	}
	for hash, t := range b.byHash {
		if t.sess == s || b.draining[hash] == s {
			continue // asked on s already, or asked once s's old stream of it is over
		}
		if t.recv != nil {
			t.recv.Abort()
			t.recv = nil
		}
		if len(t.waiters) == 0 {
			delete(b.byHash, hash) // its old socket sends nothing more here
			continue
		}
		recv, err := store.Receive(t.hash, t.size)
		if err != nil {
			t.settle(fmt.Errorf("bundle %s: %w", t.hash, err))
			delete(b.byHash, hash)
			continue
		}
		t.sess, t.recv = s, recv
		job := t.anyWaiter()
		t.job = job
		wants[job] = append(wants[job], t.hash)
		_, canFill := recv.(FrameFiller)
		t.framesAsked = s.frames.Load() && canFill && !t.whole
		t.filled = false
		if t.framesAsked {
			frames[job] = append(frames[job], t.hash)
		}
	}
	b.mu.Unlock()

	jobs := make([]string, 0, len(wants))
	for j := range wants {
		jobs = append(jobs, j)
	}
	slices.Sort(jobs)
	for _, job := range jobs {
		hashes := wants[job]
		slices.Sort(hashes)
		slices.Sort(frames[job])
		// Not a job's context: a want already recorded as asked on s must reach s, or every
		// job waiting for it would wait for the next socket.
		if err := s.conn.Send(context.Background(), &protocol.BundleWant{Job: job, Hashes: hashes, Frames: frames[job]}); err != nil {
			return // s ended; the next socket asks again
		}
		s.log.Info("asked the app for bundles", zap.String("job", job), zap.Strings("bundles", hashes), zap.Int("by_frames", len(frames[job])))
	}
}

// ended reports whether the session's socket has ended.
func (s *session) ended() bool {
	select {
	case <-s.conn.Done():
		return true
	default:
		return false
	}
}

// onChunk writes one binary frame, a bundle chunk, into the bundle it belongs to. It reports
// whether the session must stop reading (too many bad messages).
func (s *session) onChunk(ctx context.Context, frame []byte) (stop bool) {
	if s.m.cfg.Bundles == nil {
		return s.reportBad(ctx, protocol.ErrUnexpected, "", "binary frames (bundle chunks) are not taken: this RTE receives no bundles (RTE_FILES=local)")
	}
	c, err := protocol.DecodeChunk(frame)
	if err != nil {
		return s.reportBad(ctx, protocol.ErrInvalid, "", err.Error())
	}
	hash := c.HashName()
	b := &s.m.bundles
	b.mu.Lock()
	t := b.byHash[hash]
	if t == nil || t.sess != s {
		draining := b.draining[hash] == s
		b.mu.Unlock()
		if draining {
			return false // the rest of a stream that already failed
		}
		return s.reportBad(ctx, protocol.ErrUnexpected, hash, fmt.Sprintf("chunk of bundle %s, which this RTE did not ask for on this socket", hash))
	}
	recv := t.recv
	b.mu.Unlock()
	// Outside the lock: a write may wait for the disk. uint64 offsets past MaxInt64 turn
	// negative here, which WriteAt refuses like any offset past the announced size.
	if _, err := recv.WriteAt(c.Payload, int64(c.Offset)); err != nil {
		b.mu.Lock()
		if b.byHash[hash] == t && t.recv == recv {
			t.settle(err)
			b.drainLocked(t)
		}
		b.mu.Unlock()
		s.m.met.bundles.WithLabelValues(bundleDiscarded).Inc()
		s.log.Warn("bundle chunk refused; the jobs waiting for it end with an error", zap.String("bundle", hash), zap.Error(err))
		return false
	}
	s.m.met.bundleBytes.Add(float64(len(c.Payload)))
	return false
}

// onBundleEnd commits the bundle whose last chunk came: it gets its name if it matches its
// size and name, and is discarded otherwise. The waiting jobs learn which.
func (s *session) onBundleEnd(ctx context.Context, m *protocol.BundleEnd) (stop bool) {
	if s.m.cfg.Bundles == nil {
		return s.reportBad(ctx, protocol.ErrUnexpected, m.Hash, "bundle.end: this RTE receives no bundles (RTE_FILES=local)")
	}
	if s.endOfDrained(m.Hash) {
		return false
	}
	b := &s.m.bundles
	b.mu.Lock()
	t := b.byHash[m.Hash]
	if t == nil || t.sess != s {
		b.mu.Unlock()
		return s.reportBad(ctx, protocol.ErrUnexpected, m.Hash, fmt.Sprintf("bundle.end for bundle %s, which this RTE is not receiving on this socket", m.Hash))
	}
	recv := t.recv
	b.mu.Unlock()

	// On the reader: the next chunk of this socket cannot arrive while the bundle is being
	// checked, and a job that asks meanwhile joins this transfer instead of asking again.
	err := recv.Commit(m.Size)
	// Counted before the waiters learn the outcome, so a Fetch that has returned is always in
	// the metrics.
	if err != nil {
		s.m.met.bundles.WithLabelValues(bundleDiscarded).Inc()
	} else {
		s.m.met.bundles.WithLabelValues(bundleOK).Inc()
	}

	b.mu.Lock()
	if err != nil && b.byHash[m.Hash] == t && t.sess == s && t.filled && !t.whole {
		job := s.m.askWholeLocked(t)
		b.mu.Unlock()
		s.log.Warn("a bundle built from reused frames failed its check; asking the app for it whole",
			zap.String("bundle", m.Hash), zap.Error(err))
		if job != "" {
			if serr := s.conn.Send(context.Background(), &protocol.BundleWant{Job: job, Hashes: []string{m.Hash}}); serr != nil {
				return false // s ended; the next socket asks again, whole
			}
		}
		return false
	}
	switch {
	case b.byHash[m.Hash] != t:
		// Forgotten meanwhile: nobody waits for it any more.
	case t.sess == s:
		delete(b.byHash, m.Hash)
		t.settle(err)
	case err == nil:
		// A newer socket took over and asked again while this copy was checked; this copy
		// is good, so the newer stream is not needed.
		t.settle(nil)
		b.drainLocked(t)
	default:
		// This copy is bad, and the newer socket's stream may still be good: t waits for it.
	}
	b.mu.Unlock()
	if err != nil {
		s.log.Warn("bundle discarded; the jobs waiting for it end with an error", zap.String("bundle", m.Hash), zap.Error(err))
		return false
	}
	s.log.Info("bundle received", zap.String("bundle", m.Hash), zap.Int64("size", m.Size))
	return false
}

// askWholeLocked makes t, whose delta transfer failed its check, wait for the bundle whole on
// the same socket, and returns the job to name in the bundle.want, or "" if t was settled
// (no new receiver could be made) or nobody waits for it. The caller holds b.mu.
func (m *Manager) askWholeLocked(t *transfer) string {
	b := &m.bundles
	t.whole, t.filled, t.framesAsked = true, false, false
	t.recv = nil
	if len(t.waiters) == 0 {
		delete(b.byHash, t.hash)
		return ""
	}
	recv, err := m.cfg.Bundles.Receive(t.hash, t.size)
	if err != nil {
		delete(b.byHash, t.hash)
		t.settle(fmt.Errorf("bundle %s: %w", t.hash, err))
		return ""
	}
	t.recv = recv
	t.job = t.anyWaiter()
	return t.job
}

// onBundleFrames takes the app's frame index of a bundle asked for by frames: the receiver
// copies the frames the cache holds, and the RTE asks with bundle.ranges for the rest.
func (s *session) onBundleFrames(ctx context.Context, m *protocol.BundleFrames) (stop bool) {
	if s.m.cfg.Bundles == nil {
		return s.reportBad(ctx, protocol.ErrUnexpected, m.Hash, "bundle.frames: this RTE receives no bundles (RTE_FILES=local)")
	}
	if s.endOfDrained(m.Hash) {
		return false // asked again already, from the start
	}
	b := &s.m.bundles
	b.mu.Lock()
	t := b.byHash[m.Hash]
	if t == nil || t.sess != s || !t.framesAsked {
		b.mu.Unlock()
		return s.reportBad(ctx, protocol.ErrUnexpected, m.Hash, fmt.Sprintf("bundle.frames for bundle %s, whose frame index this RTE did not ask for on this socket", m.Hash))
	}
	t.framesAsked = false
	// t.job, not a waiter: every job may have stopped waiting, and the transfer on a live
	// socket still carries on (leave).
	recv, job := t.recv, t.job
	b.mu.Unlock()

	fail := func(err error) bool {
		b.mu.Lock()
		if b.byHash[m.Hash] == t && t.recv == recv {
			t.settle(err)
			delete(b.byHash, m.Hash) // the app sends nothing more of it: no ranges were asked
			recv.Abort()
		}
		b.mu.Unlock()
		s.m.met.bundles.WithLabelValues(bundleDiscarded).Inc()
		s.log.Warn("bundle frame index refused; the jobs waiting for it end with an error", zap.String("bundle", m.Hash), zap.Error(err))
		return false
	}
	if m.Size != t.size {
		return fail(fmt.Errorf("bundle %s: bundle.frames says %d bytes, but %d were announced", m.Hash, m.Size, t.size))
	}
	// On the reader, like Commit: copying frames reads the cache, and no chunk of this bundle
	// can come before the ranges are asked for.
	missing, filled, err := recv.(FrameFiller).Fill(m.Frames)
	if err != nil {
		return fail(err)
	}
	b.mu.Lock()
	if b.byHash[m.Hash] == t && t.recv == recv {
		t.filled = filled > 0
	}
	b.mu.Unlock()
	if missing == nil {
		missing = []protocol.ByteRange{}
	}
	if err := s.conn.Send(context.Background(), &protocol.BundleRanges{Job: job, Hash: m.Hash, Ranges: missing}); err != nil {
		return false // s ended; the next socket asks again
	}
	s.m.met.bundleReused.Add(float64(filled))
	s.log.Info("reused frames of cached bundles; asked the app for the rest", zap.String("bundle", m.Hash),
		zap.Int("frames", len(m.Frames)), zap.Int64("reused_bytes", filled), zap.Int("ranges", len(missing)))
	return false
}

// onBundleMissing ends the wait for a bundle the app cannot send, with the app's reason.
func (s *session) onBundleMissing(ctx context.Context, m *protocol.BundleMissing) (stop bool) {
	if s.m.cfg.Bundles == nil {
		return s.reportBad(ctx, protocol.ErrUnexpected, m.Hash, "bundle.missing: this RTE receives no bundles (RTE_FILES=local)")
	}
	if s.endOfDrained(m.Hash) {
		return false
	}
	b := &s.m.bundles
	b.mu.Lock()
	t := b.byHash[m.Hash]
	if t == nil || t.sess != s {
		b.mu.Unlock()
		return s.reportBad(ctx, protocol.ErrUnexpected, m.Hash, fmt.Sprintf("bundle.missing for bundle %s, which this RTE did not ask for on this socket", m.Hash))
	}
	delete(b.byHash, m.Hash)
	t.recv.Abort()
	reason := protocol.PeerText(m.Reason, maxMissingReason)
	t.settle(fmt.Errorf("the app has no bundle %s to send: %s", m.Hash, reason))
	b.mu.Unlock()
	s.m.met.bundles.WithLabelValues(bundleMissing).Inc()
	s.log.Warn("the app cannot send a bundle; the jobs waiting for it end with an error", zap.String("bundle", m.Hash), zap.String("reason", reason))
	return false
}

// endOfDrained reports whether a bundle.end or bundle.missing ends a stream this socket was
// draining; then a job that waits for the same bundle meanwhile is asked for it now.
func (s *session) endOfDrained(hash string) bool {
	b := &s.m.bundles
	b.mu.Lock()
	drained := b.draining[hash] == s
	if drained {
		delete(b.draining, hash)
	}
	b.mu.Unlock()
	if drained {
		s.m.askForBundles(s)
	}
	return drained
}

// reportBad answers a bad frame with an error message and counts it against the socket's
// budget of bad messages; it reports whether that budget closed the socket.
func (s *session) reportBad(ctx context.Context, code, ref, message string) (stop bool) {
	s.m.met.bad.WithLabelValues(code).Inc()
	s.log.Warn("bad message from the app", zap.String("code", code), zap.String("message", message), zap.String("ref", ref))
	if err := s.conn.ReportBad(ctx, protocol.Error{Code: code, Message: message, Ref: ref}); err != nil {
		s.log.Warn("closing the socket", zap.Error(err))
		return true
	}
	return false
}
