package rte

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// readiness is /ready's answer: 200 only while the RTE is of use to the app. It is safe for
// concurrent use: the listener asks it for every probe.
type readiness struct {
	outbound bool
	spool    interface{ Healthy() error }
	// engine reports whether the job engine could start a job (jobs.Manager.Ready); nil
	// always could.
	engine func(context.Context) error
	socket interface {
		Connected() bool
		Welcomed() (approved, ok bool)
	}

	mu       sync.Mutex
	started  bool // everything runs: the listener, the socket's owner, the calls to the app
	draining bool // a signal came: no new jobs, so the app should look elsewhere
}

func (r *readiness) start() {
	r.mu.Lock()
	r.started = true
	r.mu.Unlock()
}

func (r *readiness) drain() {
	r.mu.Lock()
	r.draining = true
	r.mu.Unlock()
}

// check is nil when ready, else the reason /ready shows.
func (r *readiness) check() error {
	r.mu.Lock()
	started, draining := r.started, r.draining
	r.mu.Unlock()
	switch {
	case !started:
		return errors.New("starting")
	case draining:
		return errors.New("draining")
	}
	if err := r.spool.Healthy(); err != nil {
		return fmt.Errorf("spool cannot be written: %w", err)
	}
	// Outbound, the RTE is only of use once its socket is up and the app has answered the
	// hello; inbound, the app dials whenever it likes, so that is no condition.
	if r.outbound {
		if !r.socket.Connected() {
			return errors.New("no socket to the app: dialling APP_URL")
		}
		if _, ok := r.socket.Welcomed(); !ok {
			return errors.New("socket to the app open, waiting for its welcome")
		}
	}
	// Asked without the lock: a container engine's answer takes a round trip.
	if r.engine != nil {
		if err := r.engine(context.Background()); err != nil {
			return fmt.Errorf("job engine: %w", err)
		}
	}
	return nil
}
