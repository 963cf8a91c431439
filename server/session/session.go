package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/socket"
)

// session is one socket's life. Three goroutines work on it: the socket's writer (conn.Run),
// the sender (hello, resend, new records, capacity) and the reader (the caller of run).
type session struct {
	m     *Manager
	conn  *socket.Conn
	log   *zap.Logger
	start time.Time

	welcomed   chan struct{} // closed by the reader when a usable welcome arrived
	isWelcomed atomic.Bool   // the same, for readers outside the session
	approved   atomic.Bool
	// frames: the app's welcome names protocol.FeatureBundleFrames, so bundles are asked for
	// by frame index first (bundles.go).
	frames atomic.Bool
	// senderDone is closed when the sender has stopped. A replacing session waits for it, so
	// only one sender at a time takes signals from the shared Changed channels.
	senderDone chan struct{}

	recordsSent atomic.Int64
	checks      checkRuns // connection checks running on this socket (checks.go)
}

func newSession(m *Manager, conn *socket.Conn, log *zap.Logger) *session {
	return &session{
		m:          m,
		conn:       conn,
		log:        log,
		start:      time.Now(),
		welcomed:   make(chan struct{}),
		senderDone: make(chan struct{}),
	}
}

func (s *session) approval() (approved, ok bool) {
	if !s.isWelcomed.Load() {
		return false, false
	}
	return s.approved.Load(), true
}

// run serves the session until the socket ends and returns why it ended. prev is the session
// this one replaces, or nil.
func (s *session) run(ctx context.Context, prev *session) error {
	s.log.Info("socket open")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = s.conn.Run(ctx) // closes the socket with 1001 when ctx ends; the cause lands in conn.Err
	}()
	go func() {
		defer wg.Done()
		defer close(s.senderDone)
		s.send(ctx, prev)
	}()
	s.read(ctx)
	cancel()
	wg.Wait()
	s.checks.wg.Wait() // ctx is done, so each ends within moments

	err := s.conn.Err()
	s.log.Info("socket closed",
		zap.Int("close_code", socket.CloseCode(err)),
		zap.Error(err),
		zap.Duration("open_for", time.Since(s.start).Round(time.Millisecond)),
		zap.Int64("records_sent", s.recordsSent.Load()))
	return err
}

// send says hello, waits for the welcome, resends what the app lacks and then follows the
// spool and the jobs until the socket ends.
func (s *session) send(ctx context.Context, prev *session) {
	if prev != nil {
		select {
		case <-prev.senderDone:
		case <-s.conn.Done():
			return
		}
	}
	hello := s.m.hello()
	if err := s.conn.Send(ctx, &hello); err != nil {
		return
	}
	timer := time.NewTimer(s.m.cfg.HelloTimeout)
	defer timer.Stop()
	select {
	case <-s.welcomed:
	case <-timer.C:
		reason := fmt.Sprintf("no welcome within %s of hello", s.m.cfg.HelloTimeout)
		s.log.Warn("closing the socket: " + reason)
		s.conn.Close(protocol.CloseProtocolError, reason)
		return
	case <-s.conn.Done():
		return
	}
	s.sendCapacity(ctx)

	// cursors holds, per job, the highest seq sent on this socket. It starts empty, so the first
	// flush sends everything the spool still holds unacked.
	cursors := map[string]int64{}
	if n, jobs := s.flush(ctx, cursors); n > 0 {
		s.log.Info("resent spooled records", zap.Int("records", n), zap.Int("jobs", jobs))
	}

	var outboxChanged, jobsChanged <-chan struct{} // nil channels never fire
	if s.m.cfg.Outbox != nil {
		outboxChanged = s.m.cfg.Outbox.Changed()
	}
	if s.m.cfg.Jobs != nil {
		jobsChanged = s.m.cfg.Jobs.Changed()
	}
	tick := time.NewTicker(s.m.cfg.CapacityEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.conn.Done():
			return
		case <-outboxChanged:
			s.flush(ctx, cursors)
		case <-jobsChanged:
			s.sendCapacity(ctx)
		case <-tick.C:
			s.sendCapacity(ctx)
		}
	}
}

// flush sends every spooled record above the job's cursor and moves the cursors on. It returns
// how many records it sent, for how many jobs.
func (s *session) flush(ctx context.Context, cursors map[string]int64) (records, jobs int) {
	out := s.m.cfg.Outbox
	if out == nil {
		return 0, 0
	}
	progress := out.Progress()
	live := make(map[string]bool, len(progress))
	for _, p := range progress {
		live[p.Job] = true
		after := cursors[p.Job]
		if p.LastSeq <= after {
			continue
		}
		sent := 0
		err := out.Pending(p.Job, after, func(rec protocol.Record, frame []byte) error {
			if err := s.conn.SendFrame(ctx, frame); err != nil {
				return err
			}
			cursors[p.Job] = rec.Seq
			sent++
			return nil
		})
		if sent > 0 {
			records += sent
			jobs++
			s.recordsSent.Add(int64(sent))
			s.m.met.recordsSent.Add(float64(sent))
		}
		if err != nil {
			select {
			case <-s.conn.Done():
				return records, jobs // the socket ended; the next one starts from the acks
			default:
			}
			s.log.Warn("could not read spooled records; they stay spooled and are tried again on the next append or socket",
				zap.String("job", p.Job), zap.Int64("after_seq", after), zap.Error(err))
		}
	}
	for job := range cursors {
		if !live[job] {
			delete(cursors, job) // acked to the end and dropped from the spool
		}
	}
	return records, jobs
}

func (s *session) sendCapacity(ctx context.Context) {
	var c protocol.Capacity
	if s.m.cfg.Jobs != nil {
		c = s.m.cfg.Jobs.Capacity()
	}
	_ = s.conn.Send(ctx, &c) // fails only once the socket ended
}

// read handles every frame until the socket ends.
func (s *session) read(ctx context.Context) {
	for {
		kind, data, err := s.conn.Read()
		if err != nil {
			return
		}
		if kind == websocket.BinaryMessage {
			if stop := s.onChunk(ctx, data); stop {
				s.drain()
				return
			}
			continue
		}
		m, err := protocol.Decode(data)
		if err != nil {
			var de *protocol.DecodeError
			if !errors.As(err, &de) {
				de = &protocol.DecodeError{Code: protocol.ErrInvalid, Message: err.Error()}
			}
			s.m.met.bad.WithLabelValues(de.Code).Inc()
			s.log.Warn("bad message from the app", zap.String("code", de.Code), zap.String("message", de.Message), zap.String("ref", de.Ref))
			if err := s.conn.ReportBad(ctx, de.Reply()); err != nil {
				s.log.Warn("closing the socket", zap.Error(err))
				s.drain()
				return
			}
			continue
		}
		if stop := s.handle(ctx, m); stop {
			s.drain()
			return
		}
	}
}

// drain reads and drops frames after this side closed the socket, until the peer's answering
// close (or the close grace) ends it, so the close handshake completes.
func (s *session) drain() {
	for {
		if _, _, err := s.conn.Read(); err != nil {
			return
		}
	}
}

// handle acts on one valid message and reports whether the session must stop reading.
func (s *session) handle(ctx context.Context, msg protocol.Message) (stop bool) {
	switch m := msg.(type) {
	case *protocol.Welcome:
		return s.onWelcome(ctx, m)
	case *protocol.Approved:
		s.approved.Store(true)
		s.log.Info("the app approved this runner")
		s.m.askForBundles(s) // jobs may wait for bundles since an earlier socket
	case *protocol.Rejected:
		s.approved.Store(false)
		s.log.Warn("the app rejected this runner; an admin must approve it at the app", zap.String("reason", protocol.PeerText(m.Reason, maxPeerText)))
	case *protocol.Ack:
		if s.m.cfg.Outbox == nil {
			s.unexpected(ctx, m.Job, "ack: this RTE has no spool and sent no records")
			return false
		}
		s.ack(m.Job, m.Seq)
	case *protocol.JobStart:
		s.jobStart(ctx, m)
	case *protocol.JobCancel:
		if s.m.cfg.Jobs == nil {
			s.unexpected(ctx, m.Job, "job.cancel: this RTE runs no jobs")
			return false
		}
		if !s.m.cfg.Jobs.Cancel(m.Job) {
			s.log.Info("job.cancel for a job this RTE does not run", zap.String("job", m.Job))
		}
	case *protocol.Settings:
		if s.m.cfg.Jobs == nil {
			s.unexpected(ctx, "", "settings: this RTE runs no jobs")
			return false
		}
		s.m.cfg.Jobs.SetMaxJobs(m.MaxJobs)
	case *protocol.Error:
		s.log.Warn("the app reported an error", zap.String("code", protocol.PeerText(m.Code, 64)),
			zap.String("message", protocol.PeerText(m.Message, maxPeerText)), zap.String("ref", protocol.PeerText(m.Ref, 128)))
	case *protocol.BundleEnd:
		return s.onBundleEnd(ctx, m)
	case *protocol.BundleMissing:
		return s.onBundleMissing(ctx, m)
	case *protocol.BundleFrames:
		return s.onBundleFrames(ctx, m)
	case *protocol.Check:
		s.onCheck(ctx, m)
	default:
		s.unexpected(ctx, protocol.Ref(m), m.Type()+": only the RTE sends this message, not the app")
	}
	return false
}

func (s *session) onWelcome(ctx context.Context, w *protocol.Welcome) (stop bool) {
	if s.isWelcomed.Load() {
		s.unexpected(ctx, "", "welcome: this socket was welcomed already")
		return false
	}
	if w.Protocol != protocol.Version {
		reason := fmt.Sprintf("protocol %d is not spoken here; this RTE speaks %d", w.Protocol, protocol.Version)
		s.log.Warn("closing the socket: "+reason, zap.String("node", protocol.PeerText(w.Node, 128)))
		s.conn.Close(protocol.CloseUnsupportedProtoV, reason)
		return true
	}
	// Acks and max_jobs apply before any job.start that follows on this socket is read.
	jobs := make([]string, 0, len(w.Acked))
	for job := range w.Acked {
		jobs = append(jobs, job)
	}
	slices.Sort(jobs)
	if s.m.cfg.Outbox != nil {
		for _, job := range jobs {
			s.ack(job, w.Acked[job])
		}
	}
	if s.m.cfg.Jobs != nil {
		s.m.cfg.Jobs.SetMaxJobs(w.MaxJobs)
	}
	s.approved.Store(w.Approved)
	s.frames.Store(w.HasFeature(protocol.FeatureBundleFrames))
	s.isWelcomed.Store(true)
	close(s.welcomed)
	s.log.Info("welcomed", zap.String("node", protocol.PeerText(w.Node, 128)), zap.Bool("approved", w.Approved),
		zap.Int("max_jobs", w.MaxJobs), zap.Int("acked_jobs", len(w.Acked)))
	s.m.askForBundles(s) // jobs still waiting for bundles ask again on this socket
	return false
}

func (s *session) ack(job string, seq int64) {
	if err := s.m.cfg.Outbox.Ack(job, seq); err != nil {
		s.log.Warn("could not apply an ack", zap.String("job", job), zap.Int64("seq", seq), zap.Error(err))
		return
	}
	s.m.met.acks.Inc()
}

func (s *session) jobStart(ctx context.Context, js *protocol.JobStart) {
	code, message := "", ""
	switch {
	case !s.isWelcomed.Load():
		code, message = protocol.RefusedNotApproved, "no welcome on this socket yet: send welcome before job.start"
	case !s.approved.Load():
		code, message = protocol.RefusedNotApproved, "this runner is not approved: an admin must approve it at the app"
	case s.m.cfg.Jobs == nil:
		code, message = protocol.RefusedInvalid, "this RTE runs no jobs"
	default:
		if err := s.m.cfg.Jobs.Start(js); err != nil {
			code, message = refusalCode(err), protocol.PeerText(err.Error(), 1000)
		}
	}
	if code == "" {
		_ = s.conn.Send(ctx, &protocol.JobAccepted{Job: js.Job})
		return
	}
	s.log.Info("refused a job", zap.String("job", js.Job), zap.String("code", code), zap.String("message", message))
	_ = s.conn.Send(ctx, &protocol.JobRefused{Job: js.Job, Code: code, Message: message})
}

// refusalCode is the job.refused code an error from Jobs.Start carries, "invalid" by default.
func refusalCode(err error) string {
	var r interface{ RefusalCode() string }
	if !errors.As(err, &r) {
		return protocol.RefusedInvalid
	}
	switch c := r.RefusalCode(); c {
	case protocol.RefusedFull, protocol.RefusedDraining, protocol.RefusedNotApproved,
		protocol.RefusedInvalid, protocol.RefusedFilesTooLarge, protocol.RefusedAlreadyRan:
		return c
	}
	return protocol.RefusedInvalid
}

// unexpected answers a valid message that this side does not take, and keeps the socket.
func (s *session) unexpected(ctx context.Context, ref, message string) {
	s.m.met.bad.WithLabelValues(protocol.ErrUnexpected).Inc()
	s.log.Warn("unexpected message from the app", zap.String("message", message), zap.String("ref", ref))
	_ = s.conn.Send(ctx, &protocol.Error{Code: protocol.ErrUnexpected, Message: message, Ref: ref})
}

// hello builds this socket's hello from the static fields and the current state.
func (m *Manager) hello() protocol.Hello {
	h := m.cfg.Hello
	h.Protocol = protocol.Version
	h.Running = []string{}
	h.Spooled = []protocol.SpooledJob{}
	if m.cfg.Jobs != nil {
		// RTE_MAX_JOBS (docs/protocol.md, hello), not a limit the app set on an earlier socket:
		// the app's welcome says which applies.
		h.MaxJobs = m.cfg.Jobs.DefaultMaxJobs()
		if r := m.cfg.Jobs.Running(); r != nil {
			h.Running = r
		}
	}
	if m.cfg.Outbox != nil {
		if p := m.cfg.Outbox.Progress(); p != nil {
			h.Spooled = p
		}
	}
	return h
}
