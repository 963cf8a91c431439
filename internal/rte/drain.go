package rte

import (
	"context"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// deliverAfterDrain is how long the drain waits for the socket to deliver what is spooled
// once the jobs ended. Delivery is best effort here: records stay spooled until acked,
// across restarts, so a longer wait only delays the exit.
const deliverAfterDrain = 5 * time.Second

// withoutHangups passes on every signal but SIGHUP, which it logs. The RTE reads its settings
// once, at start, so a reload has nothing to do; and a terminal hang-up or a careless kill -HUP
// must not cut running jobs. The forwarding ends when quit closes. A nil sigs forwards nothing.
func withoutHangups(sigs <-chan os.Signal, quit <-chan struct{}, logger *zap.Logger) <-chan os.Signal {
	out := make(chan os.Signal, 2)
	if sigs == nil {
		return out
	}
	go func() {
		for {
			var sig os.Signal
			select {
			case sig = <-sigs:
			case <-quit:
				return
			}
			if sig == syscall.SIGHUP {
				logger.Info("SIGHUP ignored: settings are read once, at start; restart the RTE to change them (SIGTERM drains)")
				continue
			}
			select {
			case out <- sig:
			case <-quit:
				return
			}
		}
	}()
	return out
}

// drain stops taking jobs, lets running ones finish for grace, then stops the rest (they end
// abandoned), and finally gives the socket a short while to deliver what is spooled. Every
// end is in the spool when drain returns, delivered or not: the next start resends it. A
// signal during the drain stops the remaining jobs at once.
func (r *rte) drain(grace time.Duration, sigs <-chan os.Signal) {
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_ = r.runner.Drain(context.Background(), grace)
	}()
	select {
	case <-drained:
	case sig := <-sigs:
		r.log.Warn("second signal: stopping running jobs now", zap.String("signal", sig.String()))
		_ = r.runner.Drain(context.Background(), 0)
		<-drained
	}
	deadline := time.Now().Add(deliverAfterDrain)
	for time.Now().Before(deadline) && r.sessions.Connected() && r.unacked() {
		time.Sleep(50 * time.Millisecond)
	}
	if r.unacked() {
		r.log.Info("records wait in the spool for the app", zap.Int("jobs", len(r.spool.Jobs())))
	}
}

// unacked reports whether the app has yet to acknowledge any spooled record.
func (r *rte) unacked() bool {
	for _, j := range r.spool.Jobs() {
		if j.Acked < j.LastSeq {
			return true
		}
	}
	return false
}
