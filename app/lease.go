package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// Several app nodes may share one store. Each runner's socket then belongs to one node at a
// time, named by the runner's lease in the store:
//
//   - Inbound: every node claims the lease of every approved inbound runner, and only the node
//     that wins it dials. The holder renews it every third of LeaseTTL; a node that stops
//     cleanly frees its leases, and one that dies loses them when they expire. Another node then
//     takes the lease at its next look (LeasePoll) and dials; the RTE resends what was not
//     acked, so nothing is lost, and the store keeps every record once.
//   - Outbound: the RTE picks the node by dialling it, so that node forces the lease to itself.
//     A node whose lease was taken closes its socket of that runner: it is the older one.
//
// Whatever one node changes that the holder must act on (a job queued or canceled there, a
// runner approved, rejected or given another max_jobs) raises the lease's Wake. The holder reads
// the leases every LeasePoll and catches up on every socket whose Wake moved (catchUp), so a job
// submitted on any node reaches the runner within about LeasePoll.

// Lease says which app node holds a runner's socket: for an inbound runner the one node that may
// dial it, for an outbound runner the node its RTE dialled.
type Lease struct {
	Runner string
	// Node is the holder's Config.Node, "" for a free lease; Instance tells apart two App values
	// (two processes) that share a Node name, so that they never both hold a lease.
	Node, Instance string
	Expires        time.Time // the holder renews it before then; afterwards any node may take it
	Connected      bool      // the holder had a welcomed socket to the runner at its last renewal
	// Wake is raised by WakeHolder whenever another node changed something the holder must act
	// on; only its changes matter.
	Wake int64
}

// LeaseClaim asks for one runner's lease in Store.ClaimLeases.
type LeaseClaim struct {
	Runner    string
	Connected bool // stored with the lease: this node has a welcomed socket to the runner
	// Force takes the lease even from a holder whose lease has not expired: an outbound RTE that
	// dialled this node has left whichever socket it had before.
	Force bool
}

// Defaults of the lease timing in Config.
const (
	// DefaultLeaseTTL is how long a lease lasts without renewal. It bounds how long an inbound
	// runner goes undialled after its node died: long enough that a busy store or a garbage
	// collection pause never costs a lease, short enough that a dead node's runners are back
	// within seconds.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultLeasePoll is how often a node reads the leases: a job submitted on another node
	// reaches the runner within about this, and a freed lease is taken within about this. The
	// read is one small table, one row per runner.
	DefaultLeasePoll = 500 * time.Millisecond
)

// leaseBook is one App's side of the leases.
type leaseBook struct {
	instance string
	kick     chan struct{} // asks keepLeases for a claim round now

	// claimMu serialises this App's claims, so that a round and an outbound socket's claim
	// cannot each take the other's result for a lost lease.
	claimMu sync.Mutex

	mu        sync.Mutex
	table     map[string]Lease     // the last read of the store's leases, by runner
	held      map[string]time.Time // runners whose lease this App holds -> expiry
	wanted    map[string]bool      // runners this App claimed in its last round
	outbound  map[string]int       // runners with an outbound socket served here -> sockets
	lastClaim time.Time            // Config.Now of the last round that reached the store
	failing   bool                 // the last read or claim failed; logged once until it works
	trouble   error                // what failed, while failing (StoreTrouble)

	// watched is, per job someone Watches, what the store said at the last look; only
	// keepLeases uses it.
	watched map[string]jobMark
}

// jobMark is what a watcher of a job cares about; a change in it is a signal.
type jobMark struct {
	state   JobState
	lastSeq int64
	cancel  bool
	message string
}

func newLeaseBook() *leaseBook {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return &leaseBook{
		instance: hex.EncodeToString(b[:]),
		kick:     make(chan struct{}, 1),
		table:    map[string]Lease{},
		held:     map[string]time.Time{},
		wanted:   map[string]bool{},
		outbound: map[string]int{},
		watched:  map[string]jobMark{},
	}
}

// remoteState is what one socket knows of the changes made on other app nodes.
type remoteState struct {
	seenWake int64       // the lease's Wake last acted on; only keepLeases uses it
	nudged   atomic.Bool // keepLeases saw the Wake move; the dispatcher catches up
	// maxJobs is the max_jobs the runner was last told, once known; only the dispatcher uses it.
	maxJobs      int
	maxJobsKnown bool
}

// claimSoon asks keepLeases for a claim round now.
func (a *App) claimSoon() {
	select {
	case a.leases.kick <- struct{}{}:
	default:
	}
}

// keepLeases claims and renews this node's leases and watches everyone's until ctx is done.
// Run owns it.
func (a *App) keepLeases(ctx context.Context) {
	poll := time.NewTicker(a.cfg.LeasePoll)
	defer poll.Stop()
	a.claimRound(ctx)
	for {
		kicked := false
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		case <-a.leases.kick:
			kicked = true
		}
		claimNow := a.readLeases(ctx)
		a.watchStored(ctx)
		a.leases.mu.Lock()
		due := !a.cfg.Now().Before(a.leases.lastClaim.Add(a.cfg.LeaseTTL / 3))
		a.leases.mu.Unlock()
		if kicked || claimNow || due {
			a.claimRound(ctx)
		}
	}
}

// readLeases reads every lease: the view that Status and mayDial use, and the Wake of each
// runner connected here. It reports whether a claim round should run now: a lease this node
// wants is free or expired, or one it holds says connected when the socket is gone (or the
// other way round).
func (a *App) readLeases(ctx context.Context) (claimNow bool) {
	all, err := a.cfg.Store.Leases(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.leaseTrouble("read the runners' leases", err)
		}
		return false
	}
	now := a.cfg.Now()
	lb := a.leases
	lb.mu.Lock()
	lb.table = make(map[string]Lease, len(all))
	for _, l := range all {
		lb.table[l.Runner] = l
		_, held := lb.held[l.Runner]
		switch {
		case held && l.Instance != lb.instance:
			claimNow = true // taken: the round finds out by whom, and lets go
		case !held && lb.wanted[l.Runner] && (l.Instance == "" || !now.Before(l.Expires)):
			claimNow = true
		}
	}
	for name := range lb.held {
		if l, ok := lb.table[name]; ok && l.Instance == lb.instance && l.Connected != (a.liveRunner(name) != nil) {
			claimNow = true
		}
	}
	lb.mu.Unlock()
	a.leaseWorks()
	for _, l := range all {
		lv := a.liveRunner(l.Runner)
		if lv == nil || lv.remote.seenWake == l.Wake {
			continue
		}
		lv.remote.seenWake = l.Wake
		lv.remote.nudged.Store(true)
		lv.poke()
	}
	return claimNow
}

// watchStored signals the watchers of every job whose stored state moved since the last look.
// This node signals its own changes as it makes them (changed); a job whose runner another node
// holds changes there, and its watchers here would otherwise wait forever. The first look at a
// job signals too, in case it moved between the watcher's own read and this look.
func (a *App) watchStored(ctx context.Context) {
	a.watchMu.Lock()
	ids := make([]string, 0, len(a.watchers))
	for id := range a.watchers {
		ids = append(ids, id)
	}
	a.watchMu.Unlock()
	seen := a.leases.watched
	for id := range seen {
		if !slices.Contains(ids, id) {
			delete(seen, id)
		}
	}
	for _, id := range ids {
		j, err := a.cfg.Store.GetJob(ctx, id)
		if err != nil {
			continue // gone, or the store is down: the lease read logs that
		}
		mark := jobMark{state: j.State, lastSeq: j.LastSeq, cancel: j.CancelRequested, message: j.Message}
		if old, ok := seen[id]; !ok || old != mark {
			seen[id] = mark
			a.changed(id)
		}
	}
}

// claimRound claims or renews, in one store transaction, the lease of every approved inbound
// runner and of every outbound runner with a socket here, and frees the leases this node no
// longer wants. Lost leases stop their sockets: an inbound runner's dialer stops (Run is woken),
// and an outbound socket is closed, since its RTE has dialled another node since.
func (a *App) claimRound(ctx context.Context) {
	lb := a.leases
	lb.claimMu.Lock()
	defer lb.claimMu.Unlock()
	runners, err := a.cfg.Store.ListRunners(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.leaseTrouble("list runners to renew their leases", err)
			a.enforceExpiry()
		}
		return
	}
	lb.mu.Lock()
	outbound := make(map[string]bool, len(lb.outbound))
	for name := range lb.outbound {
		outbound[name] = true
	}
	lb.mu.Unlock()
	var claims []LeaseClaim
	wanted := map[string]bool{}
	for _, r := range runners {
		switch {
		case outbound[r.Name]:
			claims = append(claims, LeaseClaim{Runner: r.Name, Connected: a.liveRunner(r.Name) != nil})
		case r.Mode == protocol.ModeInbound && r.State == StateApproved && r.URL != "":
			claims = append(claims, LeaseClaim{Runner: r.Name, Connected: a.liveRunner(r.Name) != nil})
		default:
			continue
		}
		wanted[r.Name] = true
	}
	now := a.cfg.Now()
	got, err := a.cfg.Store.ClaimLeases(ctx, a.cfg.Node, lb.instance, claims, now, now.Add(a.cfg.LeaseTTL))
	if err != nil {
		if ctx.Err() == nil {
			a.leaseTrouble("claim the runners' leases", err)
			a.enforceExpiry()
		}
		return
	}
	lb.mu.Lock()
	var release []string
	for name := range lb.held {
		if !wanted[name] {
			release = append(release, name)
		}
	}
	lb.mu.Unlock()
	if len(release) > 0 {
		if err := a.cfg.Store.ReleaseLeases(ctx, lb.instance, release); err != nil && ctx.Err() == nil {
			a.log.Warn("freeing leases this node no longer needs failed; other nodes take them when they expire",
				zap.Strings("runners", release), zap.Error(err))
		}
	}

	lb.mu.Lock()
	held := make(map[string]time.Time, len(got))
	var lost []Lease
	var gained []string
	for _, l := range got {
		lb.table[l.Runner] = l
		if l.Instance == lb.instance {
			held[l.Runner] = l.Expires
			if _, had := lb.held[l.Runner]; !had {
				gained = append(gained, l.Runner)
			}
		} else if _, had := lb.held[l.Runner]; had {
			lost = append(lost, l)
		}
	}
	for _, name := range release {
		delete(lb.table, name)
	}
	changed := len(gained) > 0 || len(lost) > 0 || len(release) > 0
	lb.held, lb.wanted, lb.lastClaim = held, wanted, now
	lb.mu.Unlock()
	a.leaseWorks()

	for _, name := range gained {
		if !outbound[name] {
			a.log.Info("this app node holds the inbound runner's lease now and dials it", zap.String("runner", name))
		}
	}
	for _, l := range lost {
		a.log.Warn("another app node holds this runner's socket now; this node lets go of it",
			zap.String("runner", l.Runner), zap.String("holder", l.Node))
		if op := a.out.peer(l.Runner); op != nil {
			op.conn.Close(protocol.CloseReplaced, fmt.Sprintf("replaced by a newer socket of this runner at app node %s", protocol.PeerText(l.Node, maxNameBytes)))
		}
	}
	if changed {
		a.wakeRun()
	}
}

// enforceExpiry gives up the leases whose expiry passed while they could not be renewed:
// another node may hold them by now, and two nodes dialling one runner would take its socket
// from each other in turn.
func (a *App) enforceExpiry() {
	now := a.cfg.Now()
	lb := a.leases
	lb.mu.Lock()
	var expired []string
	for name, exp := range lb.held {
		if !now.Before(exp) {
			expired = append(expired, name)
			delete(lb.held, name)
		}
	}
	lb.mu.Unlock()
	if len(expired) == 0 {
		return
	}
	a.log.Error("leases expired because the store could not be reached to renew them; this node stops serving those runners until it can claim them again",
		zap.Strings("runners", expired))
	for _, name := range expired {
		if op := a.out.peer(name); op != nil {
			op.conn.Close(protocol.CloseReplaced, "the app node lost this runner's lease; dial again")
		}
	}
	a.wakeRun()
}

// leaseTrouble logs a failure to read or claim leases once, until they work again: the poll
// runs twice a second, and a store that is down must not flood the log.
func (a *App) leaseTrouble(what string, err error) {
	a.leases.mu.Lock()
	first := !a.leases.failing
	a.leases.failing = true
	a.leases.trouble = fmt.Errorf("could not %s: %w", what, err)
	a.leases.mu.Unlock()
	if first {
		a.log.Error("could not "+what+"; trying again every lease poll, quietly until it works", zap.Error(err))
	}
}

func (a *App) leaseWorks() {
	a.leases.mu.Lock()
	was := a.leases.failing
	a.leases.failing = false
	a.leases.trouble = nil
	a.leases.mu.Unlock()
	if was {
		a.log.Info("the runners' leases can be read and claimed again")
	}
}

// StoreTrouble says why this App's last read or claim of the runners' leases failed, or
// returns nil while they work. Run reads and claims them every LeasePoll, so it reflects the
// store within about that. While it is not nil the node gives up every lease it could not
// renew once it expires, and with it those runners' sockets (docs/app-nodes.md): a readiness
// probe should report the node not ready.
func (a *App) StoreTrouble() error {
	a.leases.mu.Lock()
	defer a.leases.mu.Unlock()
	return a.leases.trouble
}

// releaseLeases frees every lease this App holds, so other nodes take its runners at once
// instead of after the leases expire. Run calls it last, after its sockets are closed.
func (a *App) releaseLeases() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lb := a.leases
	lb.claimMu.Lock()
	defer lb.claimMu.Unlock()
	if err := a.cfg.Store.ReleaseLeases(ctx, lb.instance, nil); err != nil {
		a.log.Warn("freeing this node's leases failed; other nodes take its runners once the leases expire",
			zap.Duration("lease_ttl", a.cfg.LeaseTTL), zap.Error(err))
	}
	lb.mu.Lock()
	lb.held = map[string]time.Time{}
	lb.mu.Unlock()
}

// mayDial reports whether this node holds the inbound runner's lease, so that it alone dials.
// A runner whose lease looks free asks for a claim round.
func (a *App) mayDial(name string) bool {
	lb := a.leases
	lb.mu.Lock()
	_, held := lb.held[name]
	l, known := lb.table[name]
	lb.mu.Unlock()
	if !held && (!known || l.Instance == "" || !a.cfg.Now().Before(l.Expires)) {
		a.claimSoon()
	}
	return held
}

// holdOutbound takes the lease of an outbound runner whose socket this node just welcomed,
// from whoever held it: the RTE dialled here, so any other socket of it is stale.
func (a *App) holdOutbound(ctx context.Context, name string) {
	lb := a.leases
	lb.mu.Lock()
	lb.outbound[name]++
	lb.mu.Unlock()
	lb.claimMu.Lock()
	defer lb.claimMu.Unlock()
	now := a.cfg.Now()
	got, err := a.cfg.Store.ClaimLeases(ctx, a.cfg.Node, lb.instance,
		[]LeaseClaim{{Runner: name, Connected: true, Force: true}}, now, now.Add(a.cfg.LeaseTTL))
	if err != nil || len(got) != 1 {
		if ctx.Err() == nil {
			a.log.Warn("could not take the outbound runner's lease; other app nodes learn of this socket at the next renewal",
				zap.String("runner", name), zap.Error(err))
		}
		return
	}
	lb.mu.Lock()
	lb.table[name] = got[0]
	lb.held[name] = got[0].Expires
	lb.wanted[name] = true
	lb.mu.Unlock()
}

// dropOutbound forgets one outbound socket of the runner; the next claim round frees the lease
// when it was the last.
func (a *App) dropOutbound(name string) {
	lb := a.leases
	lb.mu.Lock()
	if lb.outbound[name]--; lb.outbound[name] <= 0 {
		delete(lb.outbound, name)
	}
	lb.mu.Unlock()
	a.claimSoon()
}

// elsewhere returns the lease of the runner when another App holds it and it has not expired.
func (a *App) elsewhere(name string) (Lease, bool) {
	lb := a.leases
	lb.mu.Lock()
	l, ok := lb.table[name]
	lb.mu.Unlock()
	if !ok || l.Instance == "" || l.Instance == lb.instance || !a.cfg.Now().Before(l.Expires) {
		return Lease{}, false
	}
	return l, true
}

// remoteStatus is Status for a runner whose socket another app node holds.
func (a *App) remoteStatus(name string) (RunnerStatus, bool) {
	l, ok := a.elsewhere(name)
	if !ok || !l.Connected {
		return RunnerStatus{Name: name}, false
	}
	return RunnerStatus{Name: name, Connected: true, Node: l.Node, Remote: true}, true
}

// socketAnywhere reports whether some app node, this one or another, holds a socket to the
// runner, so that a waiting outbound runner whose RTE is connected is not dropped as stale.
func (a *App) socketAnywhere(name string) bool {
	if a.out.peer(name) != nil {
		return true
	}
	_, ok := a.remoteStatus(name)
	return ok
}

// wakeHolder tells the node holding the runner's socket to look at the store again: this node's
// dispatcher when the socket is here, otherwise whichever node holds it, through the lease's
// Wake. A failure only delays the news until the holder's next change.
func (a *App) wakeHolder(ctx context.Context, runner string) {
	if lv := a.liveRunner(runner); lv != nil {
		lv.poke()
		return
	}
	if err := a.cfg.Store.WakeHolder(ctx, runner); err != nil {
		a.log.Warn("could not tell the app node holding the runner's socket to look at the store; it sees the change at its next dispatch or reconnect",
			zap.String("runner", runner), zap.Error(err))
	}
}

// catchUp acts on what other app nodes changed for the runner of this socket: a removed outbound
// runner's socket is closed, an approval made elsewhere is told, a new max_jobs is sent, and
// requested cancels are sent (again: the RTE ignores a second cancel). Queued jobs are the
// dispatch that follows. It runs on the runner's dispatcher.
func (a *App) catchUp(ctx context.Context, lv *live) {
	name := lv.peer.Runner
	op := a.out.peer(name)
	if op != nil && op.conn != lv.peer.Conn {
		op = nil // this socket is being replaced by a newer one here
	}
	r, err := a.cfg.Store.GetRunner(ctx, name)
	if errors.Is(err, ErrNotFound) || (err == nil && op != nil && r.Mode != protocol.ModeOutbound) {
		if op != nil {
			a.log.Info("outbound runner was removed or changed at another app node; closing its socket", zap.String("runner", name))
			op.conn.Close(protocol.CloseRejected, "the runner was removed at the app")
		}
		return
	}
	if err != nil {
		a.log.Error("reading the runner to catch up with other app nodes failed; trying again at the next change", zap.String("runner", name), zap.Error(err))
		return
	}
	a.tellApprovedOnce(ctx, lv, r)
	if !lv.remote.maxJobsKnown {
		lv.remote.maxJobs, lv.remote.maxJobsKnown = lv.peer.Welcome.MaxJobs, true
	}
	if r.MaxJobs != lv.remote.maxJobs {
		if err := lv.peer.Send(ctx, protocol.Settings{MaxJobs: r.MaxJobs}); err == nil {
			lv.remote.maxJobs = r.MaxJobs
		}
	}
	jobs, err := a.cfg.Store.ListJobs(ctx, JobFilter{Runner: name, States: []JobState{JobDispatched, JobRunning}})
	if err != nil {
		a.log.Error("listing the runner's jobs to send cancels requested at other app nodes failed; they go out at its next reconnect", zap.String("runner", name), zap.Error(err))
		return
	}
	for _, j := range jobs {
		if j.CancelRequested {
			_ = lv.peer.Send(ctx, protocol.JobCancel{Job: j.ID})
		}
	}
}

// tellApprovedOnce sends approved on an outbound socket that was welcomed unapproved, once the
// store says approved: the approval may have come from another app node. Dispatch calls it
// before any job.start, which an unapproved RTE would refuse.
func (a *App) tellApprovedOnce(ctx context.Context, lv *live, r *Runner) {
	if r.Mode != protocol.ModeOutbound || r.State != StateApproved || lv.peer.Welcome.Approved {
		return
	}
	op := a.out.peer(r.Name)
	if op == nil || op.conn != lv.peer.Conn || !op.approved.CompareAndSwap(false, true) {
		return
	}
	if err := lv.peer.Send(ctx, protocol.Approved{}); err != nil {
		return // the socket is closing; the next welcome says approved
	}
	a.log.Info("outbound runner was approved at another app node; told it on its socket here", zap.String("runner", r.Name))
}
