package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// RunnerStatus is a runner's live connection state, for pages and the CLI.
type RunnerStatus struct {
	Name      string
	Connected bool
	Capacity  protocol.Capacity // as the runner last reported it (the hello's, until a capacity message)
	Hello     protocol.Hello
	Node      string // the app node holding the socket
	// Remote: another app node sharing the store holds the socket (Node). Capacity and Hello
	// are that node's to know and are left empty here.
	Remote bool
}

// Status reports the runner's live connection. ok is false when no app node holds a socket to
// it; then only Name is set. A socket another app node holds is read from the runner's lease,
// as of the last lease poll, with Remote set.
func (a *App) Status(name string) (RunnerStatus, bool) {
	lv := a.liveRunner(name)
	if lv == nil {
		return a.remoteStatus(name)
	}
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return RunnerStatus{Name: name, Connected: true, Capacity: lv.capacity, Hello: lv.peer.Hello, Node: a.cfg.Node}, true
}

// SetMaxJobs stores the runner page's override of the runner's RTE_MAX_JOBS (0: the runner's
// own setting) and, when the runner is connected, sends it at once in a settings message.
func (a *App) SetMaxJobs(ctx context.Context, name string, maxJobs int) error {
	if maxJobs < 0 {
		return fmt.Errorf("set max jobs of runner %q: %d must not be negative", name, maxJobs)
	}
	a.mu.Lock()
	r, err := a.cfg.Store.GetRunner(ctx, name)
	if err == nil {
		r.MaxJobs = maxJobs
		err = a.cfg.Store.PutRunner(ctx, r)
	}
	a.mu.Unlock()
	if err != nil {
		return fmt.Errorf("set max jobs of runner %q: %w", name, err)
	}
	if lv := a.liveRunner(name); lv != nil {
		// The runner answers with a capacity message, which wakes dispatch.
		if err := lv.peer.Send(ctx, protocol.Settings{MaxJobs: maxJobs}); err != nil {
			return fmt.Errorf("set max jobs of runner %q: stored, but the runner gets it only at its next connect: %w", name, err)
		}
		return nil
	}
	a.wakeHolder(ctx, name)
	return nil
}

// live is one connected runner.
type live struct {
	peer *Peer
	// wake asks the runner's dispatcher to look at the queue; one pending wake is enough.
	wake chan struct{}

	mu       sync.Mutex
	capacity protocol.Capacity
	// hold stops dispatch after the runner refused a job as full or draining, until its next
	// capacity message: dispatching again at once would only be refused again, in a loop.
	hold bool

	// owned caches, per job id, whether the job belongs to this runner; only the goroutine
	// that handles the runner's messages uses it. It holds at most maxOwnedCache ids, so a
	// runner sending records of ever new job ids cannot grow it without end.
	owned map[string]bool

	transfers transfers // bundles being sent (bundles.go)

	remote remoteState // changes made on other app nodes (lease.go)
}

func (lv *live) poke() {
	select {
	case lv.wake <- struct{}{}:
	default:
	}
}

// freeSlots says how many more jobs the runner can take now, and when none, why. running and
// dispatched count the app's own jobs of this runner: the runner's count can lag behind a
// job.start still on the wire, and the app's can lag behind an end record not yet stored, so
// the larger of the two running counts is used.
func (lv *live) freeSlots(running, dispatched int) (int, string) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	name := lv.peer.Runner
	switch {
	case lv.capacity.Draining:
		return 0, fmt.Sprintf("runner %q is draining (shutting down) and takes no new jobs", name)
	case lv.hold:
		return 0, fmt.Sprintf("runner %q refused a job as full or draining; waiting for it to report free capacity", name)
	case lv.capacity.MaxJobs == 0:
		return 1 << 30, ""
	}
	free := lv.capacity.MaxJobs - max(lv.capacity.Running, running) - dispatched
	if free <= 0 {
		return 0, fmt.Sprintf("runner %q has no free slot (max_jobs %d)", name, lv.capacity.MaxJobs)
	}
	return free, ""
}

func (a *App) liveRunner(name string) *live {
	a.liveMu.Lock()
	defer a.liveMu.Unlock()
	return a.live[name]
}

// wakeDispatch wakes the dispatcher of the runner, when it is connected to this node.
func (a *App) wakeDispatch(runner string) {
	if lv := a.liveRunner(runner); lv != nil {
		lv.poke()
	}
}

// wakeRun makes Run look at the runners now instead of at its next poll.
func (a *App) wakeRun() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// serve runs one connected runner until its socket ends or ctx is done: the writer, the
// reader, the dispatcher, and the handling of what the runner sends, which happens here. It
// returns why the socket ended, once every goroutine it started has returned.
func (a *App) serve(ctx context.Context, peer *Peer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lv := &live{peer: peer, wake: make(chan struct{}, 1), owned: map[string]bool{}}
	lv.capacity = protocol.Capacity{Running: len(peer.Hello.Running), MaxJobs: peer.Hello.MaxJobs}
	if peer.Welcome.MaxJobs > 0 {
		lv.capacity.MaxJobs = peer.Welcome.MaxJobs
	}
	a.liveMu.Lock()
	a.live[peer.Runner] = lv
	a.liveMu.Unlock()
	defer func() {
		a.liveMu.Lock()
		if a.live[peer.Runner] == lv {
			delete(a.live, peer.Runner)
		}
		a.liveMu.Unlock()
	}()

	var wg sync.WaitGroup
	defer wg.Wait()
	defer lv.transfers.wg.Wait() // after cancel, which ends a transfer waiting for the socket
	defer cancel()
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer cancel()
		_ = peer.Run(ctx)
	}()
	in := make(chan protocol.Message, maxBatchRecords)
	budget := newByteBudget(maxInflightBytes)
	go func() {
		defer wg.Done()
		defer cancel()
		defer close(in)
		a.read(ctx, lv, in, budget)
	}()

	if err := a.reconcile(ctx, lv); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.log.Error("runner connected, but the app could not check its jobs against the runner's; closing the socket to try again",
			zap.String("runner", peer.Runner), zap.Error(err))
		peer.Conn.Close(websocket.CloseInternalServerErr, "app could not read its jobs")
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.dispatchLoop(ctx, lv)
	}()
	lv.poke()
	if err := a.handle(ctx, lv, in, budget); err != nil && ctx.Err() == nil {
		a.log.Error("closing the runner's socket: the app could not store what the runner sent; the runner resends it after the reconnect",
			zap.String("runner", peer.Runner), zap.Error(err))
		peer.Conn.Close(websocket.CloseInternalServerErr, "app could not store records")
		return err
	}
	if err := peer.Conn.Err(); err != nil {
		return err
	}
	return ctx.Err()
}

// reconcile compares the app's dispatched and running jobs of the runner with what its hello
// says it holds, once per socket, before anything is dispatched:
//
//   - A job the runner holds (running or spooled) is running; a pending cancel is sent again,
//     since the last one may have been lost with the old socket.
//   - A dispatched job the runner does not hold never arrived (its job.start was lost with the
//     socket), so job.start is sent again: the RTE answers job.accepted again for a job it has
//     and never runs one twice, so this cannot run a playbook twice. A dispatched job whose
//     cancel was requested ends canceled instead, since it never started.
//   - A running job the runner does not hold, with no end stored, ends abandoned. The runner
//     would list it while running and keep it spooled until its end is acked; a runner that
//     does neither lost its spool (a new volume, or another RTE answering under this name), so
//     no more records will come. Sending job.start again would run the playbook a second time,
//     and waiting would show the job running forever.
func (a *App) reconcile(ctx context.Context, lv *live) error {
	hello := lv.peer.Hello
	holds := map[string]bool{}
	for _, j := range hello.Running {
		holds[j] = true
	}
	for _, s := range hello.Spooled {
		holds[s.Job] = true
	}
	jobs, err := a.cfg.Store.ListJobs(ctx, JobFilter{Runner: lv.peer.Runner, States: []JobState{JobDispatched, JobRunning}})
	if err != nil {
		return fmt.Errorf("list jobs of runner %q: %w", lv.peer.Runner, err)
	}
	runner, err := a.cfg.Store.GetRunner(ctx, lv.peer.Runner)
	if errors.Is(err, ErrNotFound) {
		return nil // removed while its socket came up; whoever removed it closes the socket
	}
	if err != nil {
		return err
	}
	for _, listed := range jobs {
		send, err := a.reconcileJob(ctx, listed.ID, holds[listed.ID], runner)
		if err != nil {
			return err
		}
		if send != nil {
			// A send that fails means the socket is gone; the next one reconciles again.
			_ = lv.peer.Send(ctx, send)
		}
	}
	return nil
}

// reconcileJob applies reconcile's rules to one job and returns the message to send for it,
// if any.
func (a *App) reconcileJob(ctx context.Context, id string, held bool, runner *Runner) (protocol.Message, error) {
	a.jobsMu.Lock()
	defer a.jobsMu.Unlock()
	j, err := a.cfg.Store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	if j.Runner != runner.Name || (j.State != JobDispatched && j.State != JobRunning) {
		return nil, nil // changed since the listing
	}
	log := a.log.With(zap.String("job", j.ID), zap.String("runner", j.Runner))
	switch {
	case held:
		a.dropSecrets(j.ID)
		if j.State == JobDispatched {
			j.State = JobRunning
			if err := a.cfg.Store.UpdateJob(ctx, j); err != nil {
				return nil, err
			}
			a.changed(j.ID)
		}
		if j.CancelRequested {
			return protocol.JobCancel{Job: j.ID}, nil
		}
		return nil, nil
	case j.State == JobDispatched && j.CancelRequested:
		return nil, a.endLocked(ctx, j, protocol.StatusCanceled, "canceled before the runner started it")
	case j.State == JobDispatched:
		if why := a.secretsLost(j); why != "" {
			return nil, a.endLocked(ctx, j, protocol.StatusError, "not started: "+why)
		}
		start, err := a.sealedStart(j, runner.Token)
		if err != nil {
			return nil, a.endLocked(ctx, j, protocol.StatusError, "not started: "+err.Error())
		}
		log.Info("runner does not hold a dispatched job; sending job.start again")
		return start, nil
	}
	// Running, and the runner does not hold it. The end may be stored already, if the app
	// stopped between storing the end record and updating the job.
	if j.LastSeq > 0 {
		last, err := a.cfg.Store.Records(ctx, j.ID, j.LastSeq-1, 1)
		if err != nil {
			return nil, err
		}
		if len(last) == 1 && last[0].Kind == protocol.KindEnd {
			applyEnd(j, last[0])
			if err := a.cfg.Store.UpdateJob(ctx, j); err != nil {
				return nil, err
			}
			a.dropSecrets(j.ID)
			a.changed(j.ID)
			return nil, nil
		}
	}
	if j.LastSeq == 0 {
		// Nothing of the job ever arrived: the runner took it (job.accepted) and restarted
		// before it spooled a record, which happens when it is killed while it fetches the
		// job's files. Blaming a lost spool would send the operator after the wrong problem.
		return nil, a.endLocked(ctx, j, protocol.StatusAbandoned, fmt.Sprintf(
			"runner %q no longer knows this job and sent no record of it: it restarted after accepting the job and before starting it (or its spool was lost); submit it again",
			j.Runner))
	}
	return nil, a.endLocked(ctx, j, protocol.StatusAbandoned, fmt.Sprintf(
		"runner %q no longer knows this job: it is neither running nor spooled there, so its spool was lost (a new volume, or another RTE under this name); records after seq %d never arrived",
		j.Runner, j.LastSeq))
}

// dispatchLoop sends queued jobs of the runner whenever it is woken, as capacity allows.
func (a *App) dispatchLoop(ctx context.Context, lv *live) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-lv.wake:
		}
		if lv.remote.nudged.Swap(false) {
			a.catchUp(ctx, lv)
		}
		if err := a.dispatch(ctx, lv); err != nil && ctx.Err() == nil {
			a.log.Error("dispatch failed; trying again at the next change", zap.String("runner", lv.peer.Runner), zap.Error(err))
		}
	}
}

// dispatch sends the runner's queued jobs, oldest first, while it has free slots, and notes on
// the rest what they wait for.
func (a *App) dispatch(ctx context.Context, lv *live) error {
	name := lv.peer.Runner
	queued, err := a.cfg.Store.ListJobs(ctx, JobFilter{Runner: name, States: []JobState{JobQueued}})
	if err != nil || len(queued) == 0 {
		return err
	}
	slices.Reverse(queued) // oldest first
	active, err := a.cfg.Store.ListJobs(ctx, JobFilter{Runner: name, States: []JobState{JobDispatched, JobRunning}})
	if err != nil {
		return err
	}
	var running, dispatched int
	for _, j := range active {
		if j.State == JobRunning {
			running++
		} else {
			dispatched++
		}
	}
	runner, err := a.cfg.Store.GetRunner(ctx, name)
	if err != nil {
		return err
	}
	a.tellApprovedOnce(ctx, lv, runner)
	for i, j := range queued {
		free, why := lv.freeSlots(running, dispatched)
		if free <= 0 {
			for _, w := range queued[i:] {
				if w.Message == waitingPrefix+why {
					continue // a long queue costs no writes while nothing changes
				}
				if err := a.noteWaiting(ctx, w.ID, why); err != nil {
					return err
				}
			}
			return nil
		}
		if ready, err := a.attachFiles(ctx, lv, j.ID); err != nil || !ready {
			if err != nil {
				return err
			}
			continue
		}
		start, ok, err := a.claim(ctx, j.ID, runner)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		dispatched++
		a.log.Info("job dispatched", zap.String("job", j.ID), zap.String("runner", name))
		if err := lv.peer.Send(ctx, start); err != nil {
			// The job stays dispatched; the reconnect sends job.start again.
			return nil
		}
	}
	return nil
}

// claim moves a queued job to dispatched and returns the job.start to send. ok is false when
// the job is no longer queued here, or cannot be sent at all (then it has ended). The state is
// stored before job.start is sent, so a crash in between leaves a dispatched job, which the
// next connect sends again; never a job the runner has and the app thinks queued.
func (a *App) claim(ctx context.Context, id string, runner *Runner) (start protocol.JobStart, ok bool, err error) {
	a.jobsMu.Lock()
	defer a.jobsMu.Unlock()
	j, err := a.cfg.Store.GetJob(ctx, id)
	if err != nil {
		return start, false, err
	}
	if j.State != JobQueued || j.Runner != runner.Name {
		return start, false, nil
	}
	if why := a.secretsLost(j); why != "" {
		return start, false, a.endLocked(ctx, j, protocol.StatusError, "not started: "+why)
	}
	start, err = a.sealedStart(j, runner.Token)
	if err != nil {
		return start, false, a.endLocked(ctx, j, protocol.StatusError, "not started: "+err.Error())
	}
	j.State = JobDispatched
	j.DispatchedAt = a.cfg.Now()
	j.Message = ""
	if err := a.cfg.Store.UpdateJob(ctx, j); err != nil {
		return start, false, err
	}
	a.changed(j.ID)
	return start, true, nil
}

// noteWaiting records on a queued job what it waits for, when that changed.
func (a *App) noteWaiting(ctx context.Context, id, why string) error {
	a.jobsMu.Lock()
	defer a.jobsMu.Unlock()
	j, err := a.cfg.Store.GetJob(ctx, id)
	if err != nil {
		return err
	}
	msg := waitingPrefix + why
	if j.State != JobQueued || j.Message == msg {
		return nil
	}
	j.Message = msg
	if err := a.cfg.Store.UpdateJob(ctx, j); err != nil {
		return err
	}
	a.changed(j.ID)
	return nil
}

// waitingPrefix starts the Message of a queued job that says what it waits for.
const waitingPrefix = "waiting: "

// expireQueued ends queued jobs that waited QueueTimeout, saying why they never started.
func (a *App) expireQueued(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	queued, err := a.cfg.Store.ListJobs(ctx, JobFilter{States: []JobState{JobQueued}})
	if err != nil {
		a.log.Error("list queued jobs failed; checking queue timeouts again at the next poll", zap.Error(err))
		return
	}
	now := a.cfg.Now()
	for _, listed := range queued {
		if now.Sub(listed.CreatedAt) < a.cfg.QueueTimeout {
			continue
		}
		if _, ok := a.elsewhere(listed.Runner); ok {
			continue // the node holding the runner's socket knows why the job waits
		}
		if err := a.expire(ctx, listed.ID); err != nil && !errors.Is(err, ErrJobEnded) {
			a.log.Error("ending a job past its queue timeout failed; trying again at the next poll", zap.String("job", listed.ID), zap.Error(err))
		}
	}
}

func (a *App) expire(ctx context.Context, id string) error {
	a.jobsMu.Lock()
	defer a.jobsMu.Unlock()
	j, err := a.cfg.Store.GetJob(ctx, id)
	if err != nil || j.State != JobQueued {
		return err
	}
	why := fmt.Sprintf("runner %q was not connected to this app", j.Runner)
	if a.liveRunner(j.Runner) != nil {
		why = fmt.Sprintf("runner %q had no free slot", j.Runner)
		if rest, ok := strings.CutPrefix(j.Message, waitingPrefix); ok {
			why = rest
		}
	}
	return a.endLocked(ctx, j, protocol.StatusError, fmt.Sprintf("never started: not dispatched within the queue timeout of %s: %s", a.cfg.QueueTimeout, why))
}

// failLostSecrets ends queued jobs whose secrets a restart of this app node lost: the runner
// would run them without a vault or become password, which is never what was asked for. Jobs
// with sealed secrets lost nothing, and jobs another node took keep their secrets there.
func (a *App) failLostSecrets(ctx context.Context) {
	queued, err := a.cfg.Store.ListJobs(ctx, JobFilter{States: []JobState{JobQueued}})
	if err != nil {
		a.log.Error("list queued jobs failed; jobs whose secrets were lost end when they are dispatched", zap.Error(err))
		return
	}
	for _, listed := range queued {
		if len(listed.SecretNames) == 0 || listed.SealedSecrets != nil || (listed.SubmitNode != "" && listed.SubmitNode != a.cfg.Node) {
			continue
		}
		a.jobsMu.Lock()
		j, err := a.cfg.Store.GetJob(ctx, listed.ID)
		if err == nil && j.State == JobQueued {
			if why := a.secretsLost(j); why != "" {
				err = a.endLocked(ctx, j, protocol.StatusError, "not started: "+why)
			}
		}
		a.jobsMu.Unlock()
		if err != nil {
			a.log.Error("ending a job whose secrets were lost failed; it ends when it is dispatched", zap.String("job", listed.ID), zap.Error(err))
		}
	}
}
