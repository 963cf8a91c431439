package app

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// dialer is Run's handle on the goroutine that keeps one runner connected.
type dialer struct {
	key    string // what the goroutine dials; a change means it must start over
	cancel context.CancelFunc
	done   chan struct{}
}

// Run keeps one socket to each approved inbound runner and serves it until ctx is done: it
// dials with Connect, redials with jittered backoff (RedialMin to RedialMax) when the socket
// drops or the dial fails, never dials a runner waiting for approval, and picks up newly
// approved runners within PollInterval (at once when approved through this App). Over each
// socket it dispatches queued jobs as capacity allows, stores records exactly once and acks
// them after they are stored. It also ends queued jobs older than QueueTimeout.
//
// Outbound runners are never dialled: they open their socket through Handler, and it is served
// the same way. Run closes those sockets when it returns and refuses new ones from then on.
//
// With several app nodes on one store, Run dials only the inbound runners whose lease this node
// holds, claims and renews leases, acts on what other nodes changed for the runners it holds,
// and frees its leases when it returns, after its sockets are closed (lease.go).
//
// Run blocks until ctx is done and all its goroutines have exited; it returns nil then. It may
// be called once per App.
func (a *App) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("app: Run was already called; an App runs once")
	}
	// Last, once no socket is left: other nodes take this node's runners at once.
	defer a.releaseLeases()
	// Outbound runners dialled in through Handler; their sockets end with Run.
	defer a.out.shutdown()
	a.failLostSecrets(ctx)
	var wg sync.WaitGroup
	dialers := map[string]*dialer{}
	defer func() {
		for _, d := range dialers {
			d.cancel()
		}
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.keepLeases(ctx)
	}()
	tick := time.NewTicker(a.cfg.PollInterval)
	defer tick.Stop()
	for {
		a.syncDialers(ctx, &wg, dialers)
		a.expireQueued(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-a.kick:
		}
	}
}

// syncDialers starts a dialer for each approved inbound runner whose lease this node holds and
// that has none, and stops the dialer of a runner that is gone, no longer approved, changed its
// address or token, or whose lease another node took.
func (a *App) syncDialers(ctx context.Context, wg *sync.WaitGroup, dialers map[string]*dialer) {
	if ctx.Err() != nil {
		return
	}
	runners, err := a.cfg.Store.ListRunners(ctx)
	if err != nil {
		a.log.Error("list runners to dial failed; retrying at the next poll", zap.Error(err))
		return
	}
	want := map[string]string{}
	for _, r := range runners {
		if r.State == StateApproved && r.Mode == protocol.ModeInbound && r.URL != "" && a.mayDial(r.Name) {
			// Not the certificate: pinning one on the first dial must not cut that socket, and a
			// runner with a new certificate has restarted, so its old socket is gone anyway.
			want[r.Name] = r.URL + " " + r.TokenFingerprint
		}
	}
	for name, d := range dialers {
		select {
		case <-d.done:
			delete(dialers, name)
			continue
		default:
		}
		if want[name] != d.key {
			// Removed once its goroutine is done, so two sockets to one runner never overlap.
			d.cancel()
		}
	}
	for name, key := range want {
		if _, ok := dialers[name]; ok {
			continue
		}
		dctx, cancel := context.WithCancel(ctx)
		d := &dialer{key: key, cancel: cancel, done: make(chan struct{})}
		dialers[name] = d
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(d.done)
			defer cancel()
			a.keepConnected(dctx, name)
		}()
	}
}

// keepConnected dials the runner and serves it, again and again, until ctx is done or the
// runner is no longer approved (then Run starts it again once it is).
func (a *App) keepConnected(ctx context.Context, name string) {
	log := a.log.With(zap.String("runner", name))
	backoff := pinning.Backoff{Min: a.cfg.RedialMin, Max: a.cfg.RedialMax}
	for ctx.Err() == nil {
		peer, err := a.Connect(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r, gerr := a.cfg.Store.GetRunner(ctx, name)
			if errors.Is(gerr, ErrNotFound) || (gerr == nil && r.State != StateApproved) {
				log.Warn("runner not dialled any more: it is no longer approved", zap.Error(err))
				return
			}
			wait := backoff.Next()
			log.Warn("runner could not be reached; dialling again", zap.Error(err), zap.Duration("retry_in", wait))
			if !sleep(ctx, wait) {
				return
			}
			continue
		}
		backoff.Reset()
		why := a.serve(ctx, peer)
		if ctx.Err() != nil {
			return
		}
		wait := backoff.Next()
		log.Warn("runner socket ended; dialling again", zap.Error(why), zap.Duration("retry_in", wait))
		if !sleep(ctx, wait) {
			return
		}
	}
}

// sleep waits d or until ctx is done, and reports whether it waited the whole time.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
