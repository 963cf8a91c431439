package session

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// Checker answers the app's connection checks (PROTOCOL.md section 9); package check's
// *Checker is the one the RTE uses. Run is called from several goroutines at once, and must
// return within the check's timeout, sooner when ctx ends, with one outcome per target.
type Checker interface {
	Run(ctx context.Context, c *protocol.Check) protocol.CheckResult
}

// DefaultMaxChecks bounds the checks running at once on one socket (Config.MaxChecks). The app
// does its waiting in a loop of its own, one check at a time per question; more than a few at
// once is an app loop gone wrong, and each one holds a goroutine and connection slots.
const DefaultMaxChecks = 4

// checkRuns holds the checks running on one socket. The zero value is ready to use.
type checkRuns struct {
	mu      sync.Mutex
	running int
	wg      sync.WaitGroup // the session waits for these before it returns
}

// onCheck starts a check off the reader goroutine, so acks, cancels and job.starts are read
// while the targets connect, and answers it with check.result when it is done. A check is not
// a job: it does not count against max_jobs and is answered by a full or draining RTE too.
func (s *session) onCheck(ctx context.Context, c *protocol.Check) {
	checker := s.m.cfg.Checker
	limit := s.m.cfg.MaxChecks
	if limit <= 0 {
		limit = DefaultMaxChecks
	}
	switch {
	case checker == nil:
		s.unexpected(ctx, c.ID, "check: this RTE does not handle connection checks: it runs without a checker, and its log says why")
		return
	case !s.isWelcomed.Load():
		s.unexpected(ctx, c.ID, "check: no welcome on this socket yet: send welcome before check")
		return
	case !s.approved.Load():
		// A check logs in to hosts with the RTE's own keys; it works only for an app that
		// approved this runner, as jobs do.
		s.unexpected(ctx, c.ID, "check: this runner is not approved: an admin must approve it at the app")
		return
	}
	s.checks.mu.Lock()
	busy := s.checks.running >= limit
	if !busy {
		s.checks.running++
		s.checks.wg.Add(1)
	}
	s.checks.mu.Unlock()
	if busy {
		s.unexpected(ctx, c.ID, fmt.Sprintf("check: %d checks are already running on this socket, the most it runs at once; send it again once one has answered", limit))
		return
	}
	go func() {
		defer s.checks.wg.Done()
		defer func() {
			s.checks.mu.Lock()
			s.checks.running--
			s.checks.mu.Unlock()
		}()
		s.runCheck(ctx, checker, c)
	}()
}

// runCheck runs one check and sends its result.
func (s *session) runCheck(ctx context.Context, checker Checker, c *protocol.Check) {
	start := time.Now()
	res := checker.Run(ctx, c)
	res.ID = c.ID
	if res.Results == nil {
		res.Results = []protocol.CheckOutcome{} // "results": null would be bad input at the app
	}
	log := s.log.With(zap.String("check", c.ID), zap.Int("targets", len(c.Targets)),
		zap.Duration("took", time.Since(start).Round(time.Millisecond)))
	frame, err := protocol.Encode(&res)
	if err != nil {
		log.Error("could not encode a connection check's result", zap.Error(err))
		_ = s.conn.Send(ctx, &protocol.Error{Code: protocol.ErrInvalid, Message: "check: the RTE could not encode its result; its log says why", Ref: c.ID})
		return
	}
	if len(frame) > protocol.MaxMessageBytes {
		// Only a check whose names and hosts are huge gets here: the outcomes echo them.
		msg := fmt.Sprintf("check: its check.result would be %d bytes, over the %d-byte message limit: send fewer targets, or shorter names, per check", len(frame), protocol.MaxMessageBytes)
		log.Warn("could not answer a connection check", zap.String("reason", msg))
		_ = s.conn.Send(ctx, &protocol.Error{Code: protocol.ErrTooLarge, Message: msg, Ref: c.ID})
		return
	}
	if err := s.conn.SendFrame(ctx, frame); err != nil {
		log.Debug("connection check not answered: the socket ended", zap.Error(err))
		return
	}
	connected := 0
	for _, o := range res.Results {
		if o.Status == protocol.CheckConnected {
			connected++
		}
	}
	log.Debug("connection check answered", zap.Int("connected", connected))
}
