package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// Records are stored in batches: whatever has arrived, up to maxBatchRecords records or
// maxBatchBytes of data, goes into one StoreRecords call, so a chatty playbook costs one
// commit (one fsync) per batch, not per record.
const (
	maxBatchRecords = 256
	maxBatchBytes   = 4 << 20
	// maxInflightBytes bounds what the reader holds ahead of the handler: room for a batch
	// being stored and the next one arriving. One message larger than this still passes on
	// its own, so the bound is this plus one message (protocol.MaxMessageBytes).
	maxInflightBytes = 8 << 20
	// messageOverhead is what a message costs in the budget beyond its record data.
	messageOverhead = 512
	// maxEndMessage bounds the end message copied into the job row; the record keeps it whole.
	maxEndMessage = 4 << 10
)

// byteBudget bounds the bytes of messages read but not yet handled. It has one taker (the
// reader) and one giver (the handler).
type byteBudget struct {
	mu    sync.Mutex
	used  int64
	limit int64
	freed chan struct{}
}

func newByteBudget(limit int64) *byteBudget {
	return &byteBudget{limit: limit, freed: make(chan struct{}, 1)}
}

// take waits until n bytes fit, or until nothing is held (so one message over the limit
// still passes), or until ctx is done.
func (b *byteBudget) take(ctx context.Context, n int64) error {
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+n <= b.limit {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		b.mu.Unlock()
		select {
		case <-b.freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *byteBudget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

func cost(m protocol.Message) int64 {
	if r, ok := m.(*protocol.Record); ok {
		return int64(len(r.Data)) + messageOverhead
	}
	return messageOverhead
}

// read hands the runner's valid messages to the handler until the socket ends or ctx is done.
// Bad messages are answered inside Peer.Next.
func (a *App) read(ctx context.Context, lv *live, in chan<- protocol.Message, budget *byteBudget) {
	peer := lv.peer
	for {
		m, err := peer.Next(ctx)
		if err != nil {
			return
		}
		if why := a.notYet(lv, m); why != "" {
			// A waiting runner was given nothing, so anything but capacity is noise from a
			// peer nobody vouched for yet: it counts toward the bad-message budget (1008 after
			// protocol.MaxBadMessages a minute) and never reaches the store.
			a.out.refusals.Warn("unapproved runner sent a message it may not send yet",
				zap.String("runner", peer.Runner), zap.String("type", m.Type()))
			if err := peer.Conn.ReportBad(ctx, protocol.Error{Code: protocol.ErrUnexpected, Ref: protocol.Ref(m), Message: why}); err != nil {
				return
			}
			continue
		}
		if err := budget.take(ctx, cost(m)); err != nil {
			return
		}
		select {
		case in <- m:
		case <-ctx.Done():
			return
		}
	}
}

// notYet says why m is not taken from a runner that waits for approval, or "" when it is:
// until approved, a runner may send only capacity (what joining needs: its hello was the
// handshake), since it holds no job of this app.
func (a *App) notYet(lv *live, m protocol.Message) string {
	if m.Type() == protocol.TypeCapacity || a.approvedPeer(lv) {
		return ""
	}
	return fmt.Sprintf("%s: runner %q is not approved yet; until an admin approves it, it may send only capacity", m.Type(), lv.peer.Runner)
}

// approvedPeer reports whether the runner on lv's socket is approved: welcomed approved, or
// told approved on this socket since.
func (a *App) approvedPeer(lv *live) bool {
	if lv.peer.Welcome.Approved {
		return true
	}
	op := a.out.peer(lv.peer.Runner)
	return op != nil && op.conn == lv.peer.Conn && op.approved.Load()
}

// maxOwnedCache bounds live.owned: past it the cache starts over, costing a store lookup per
// job again, never memory.
const maxOwnedCache = 4096

// handle acts on the runner's messages in the order they came, storing runs of records in
// batches, until in is closed. An error means records could not be stored: the caller closes
// the socket, and the runner resends everything unacked after the reconnect.
func (a *App) handle(ctx context.Context, lv *live, in <-chan protocol.Message, budget *byteBudget) error {
	var next protocol.Message
	for {
		m := next
		next = nil
		if m == nil {
			var ok bool
			if m, ok = <-in; !ok {
				return nil
			}
		}
		rec, ok := m.(*protocol.Record)
		if !ok {
			a.handleControl(ctx, lv, m)
			budget.give(cost(m))
			continue
		}
		batch := []protocol.Record{*rec}
		held := cost(rec)
		size := len(rec.Data)
	collect:
		for len(batch) < maxBatchRecords && size < maxBatchBytes {
			select {
			case m, ok := <-in:
				if !ok {
					break collect
				}
				r, isRecord := m.(*protocol.Record)
				if !isRecord {
					next = m // handled after the batch, keeping the runner's order
					break collect
				}
				batch = append(batch, *r)
				held += cost(r)
				size += len(r.Data)
			default:
				break collect
			}
		}
		err := a.storeBatch(ctx, lv, batch)
		budget.give(held)
		if err != nil {
			return err
		}
	}
}

// storeBatch stores the records of jobs that belong to the runner, then acks each job
// cumulatively, then moves the jobs' states along. The ack is sent only after StoreRecords
// returned, that is after the commit: an ack promises the runner it may drop those records.
func (a *App) storeBatch(ctx context.Context, lv *live, batch []protocol.Record) error {
	keep := batch[:0]
	var order []string // jobs in the order they first appear, so acks go out in a stable order
	seen := map[string]bool{}
	for _, r := range batch {
		mine, err := a.ownedBy(ctx, lv, r.Job)
		if err != nil {
			return err
		}
		if !mine {
			continue
		}
		keep = append(keep, r)
		if !seen[r.Job] {
			seen[r.Job] = true
			order = append(order, r.Job)
		}
	}
	if len(keep) == 0 {
		return nil
	}
	heads, err := a.cfg.Store.StoreRecords(ctx, keep)
	if err != nil {
		return fmt.Errorf("store %d records of runner %q: %w", len(keep), lv.peer.Runner, err)
	}
	for _, job := range order {
		if seq := heads[job]; seq > 0 {
			if err := lv.peer.Send(ctx, protocol.Ack{Job: job, Seq: seq}); err != nil {
				// The socket is gone; the records are stored, and the welcome of the next
				// socket carries the ack instead.
				break
			}
		}
	}
	for _, job := range order {
		if err := a.applyRecords(ctx, job, keep); err != nil {
			// The records are stored and acked; the job's state catches up at the next
			// record or the next connect (reconcile reads the stored end).
			a.log.Error("records stored, but updating the job failed", zap.String("job", job), zap.Error(err))
		}
		a.changed(job)
	}
	return nil
}

// ownedBy reports whether job belongs to the runner. A record for a job the app does not know,
// or gave to another runner, is not stored and not acked, and the runner hears why once per
// socket: storing it would let one runner write into another's job, and acking it unstored
// would be a lie the runner acts on by dropping the records.
func (a *App) ownedBy(ctx context.Context, lv *live, job string) (bool, error) {
	if mine, ok := lv.owned[job]; ok {
		return mine, nil
	}
	j, err := a.cfg.Store.GetJob(ctx, job)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return false, fmt.Errorf("look up job %q: %w", job, err)
	case j.Runner == lv.peer.Runner:
		lv.remember(job, true)
		return true, nil
	}
	// Cached, so a spool full of one stray job's records costs one bad message, not one per
	// record; a runner inventing new job ids pays one each.
	lv.remember(job, false)
	a.out.refusals.Warn("runner sent records of a job the app did not give it; they are not stored or acked",
		zap.String("runner", lv.peer.Runner), zap.String("job", protocol.PeerText(job, 128)))
	// A bad message like any other: past protocol.MaxBadMessages a minute the socket closes
	// with 1008, as the RTE does to an app that misbehaves.
	_ = lv.peer.Conn.ReportBad(ctx, protocol.Error{Code: protocol.ErrUnexpected, Ref: job,
		Message: fmt.Sprintf("record: job %q is not a job this app gave runner %q; its records are not stored and will not be acked", job, lv.peer.Runner)})
	return false, nil
}

// remember caches whether job belongs to the runner, starting the cache over when it is full.
func (lv *live) remember(job string, mine bool) {
	if len(lv.owned) >= maxOwnedCache {
		clear(lv.owned)
	}
	lv.owned[job] = mine
}

// applyRecords moves a job along after its records were stored: its first record makes it
// running (StartedAt from that record), its end record ends it.
func (a *App) applyRecords(ctx context.Context, job string, recs []protocol.Record) error {
	var first, end *protocol.Record
	for i := range recs {
		r := &recs[i]
		if r.Job != job {
			continue
		}
		if first == nil || r.Seq < first.Seq {
			first = r
		}
		if r.Kind == protocol.KindEnd {
			end = r
		}
	}
	if first == nil {
		return nil
	}
	a.jobsMu.Lock()
	defer a.jobsMu.Unlock()
	j, err := a.cfg.Store.GetJob(ctx, job)
	if err != nil || j.State == JobEnded {
		return err
	}
	// The runner has the job, so the secrets are not needed for a job.start again.
	a.dropSecrets(j.ID)
	before := *j
	if j.State != JobRunning {
		j.State = JobRunning
		j.Message = ""
	}
	if j.StartedAt.IsZero() {
		j.StartedAt = first.At
	}
	if end != nil {
		applyEnd(j, *end)
		a.log.Info("job ended", zap.String("job", j.ID), zap.String("runner", j.Runner),
			zap.String("status", j.Status), zap.Int("exit_code", j.ExitCode))
	}
	if j.State == before.State && j.StartedAt.Equal(before.StartedAt) && j.Message == before.Message {
		return nil
	}
	if err := a.cfg.Store.UpdateJob(ctx, j); err != nil {
		return err
	}
	if end != nil {
		a.wakeDispatch(j.Runner)
	}
	return nil
}

// knownStatus lists the end statuses of protocol v1.
var knownStatus = map[string]bool{
	protocol.StatusSuccess: true, protocol.StatusFailed: true, protocol.StatusCanceled: true,
	protocol.StatusAbandoned: true, protocol.StatusError: true, protocol.StatusTimeout: true,
}

// applyEnd ends j as its end record says. An end record that does not read as one still ends
// the job, with status error saying so: it is the runner's last word either way.
func applyEnd(j *Job, r protocol.Record) {
	var d protocol.EndData
	j.State = JobEnded
	j.EndedAt = r.At
	switch err := json.Unmarshal(r.Data, &d); {
	case err != nil:
		j.Status = protocol.StatusError
		j.Message = "the runner's end record does not read as one: " + protocol.PeerText(err.Error(), 200)
	case !knownStatus[d.Status]:
		j.Status = protocol.StatusError
		j.ExitCode = d.ExitCode
		j.Message = fmt.Sprintf("the runner ended the job with status %q, which protocol v1 does not know: %s", protocol.PeerText(d.Status, 32), protocol.PeerText(d.Message, maxEndMessage))
	default:
		j.Status = d.Status
		j.ExitCode = d.ExitCode
		j.Message = protocol.PeerText(d.Message, maxEndMessage)
	}
}

// handleControl acts on a message other than a record.
func (a *App) handleControl(ctx context.Context, lv *live, m protocol.Message) {
	log := a.log.With(zap.String("runner", lv.peer.Runner))
	switch m := m.(type) {
	case *protocol.JobAccepted:
		a.accepted(ctx, lv, m.Job)
	case *protocol.JobRefused:
		a.refused(ctx, lv, m)
	case *protocol.Capacity:
		lv.mu.Lock()
		lv.capacity = *m
		lv.hold = false
		lv.mu.Unlock()
		lv.poke()
	case *protocol.BundleWant:
		a.serveBundles(ctx, lv, m)
	case *protocol.BundleRanges:
		a.serveRanges(ctx, lv, m)
	case *protocol.Error:
		if a.checkRefused(lv, m) {
			return // Check returns it to its caller
		}
		log.Warn("runner answered a message with an error",
			zap.String("code", protocol.PeerText(m.Code, 64)), zap.String("ref", protocol.PeerText(m.Ref, 128)),
			zap.String("message", protocol.PeerText(m.Message, 300)))
	case *protocol.CheckResult:
		a.checkAnswered(lv, m)
	}
}

// accepted marks a dispatched job running. The runner has the job now, so its secrets are no
// longer needed here. A cancel requested while the job.start was on the wire is sent again.
func (a *App) accepted(ctx context.Context, lv *live, id string) {
	a.jobsMu.Lock()
	j, err := a.cfg.Store.GetJob(ctx, id)
	if err != nil || j.Runner != lv.peer.Runner {
		a.jobsMu.Unlock()
		a.log.Warn("runner accepted a job the app did not give it", zap.String("runner", lv.peer.Runner), zap.String("job", id), zap.Error(err))
		return
	}
	a.dropSecrets(j.ID)
	if j.State == JobDispatched || j.State == JobQueued {
		j.State = JobRunning
		j.Message = ""
		if err := a.cfg.Store.UpdateJob(ctx, j); err != nil {
			a.log.Error("storing an accepted job failed; the next connect corrects it", zap.String("job", id), zap.Error(err))
		}
		a.changed(j.ID)
	}
	a.jobsMu.Unlock()
	if j.CancelRequested && j.State != JobEnded {
		_ = lv.peer.Send(ctx, protocol.JobCancel{Job: j.ID})
	}
}

// refused puts a job the runner is too busy for back in the queue, and ends one it will never
// take.
func (a *App) refused(ctx context.Context, lv *live, m *protocol.JobRefused) {
	log := a.log.With(zap.String("runner", lv.peer.Runner), zap.String("job", m.Job), zap.String("code", m.Code))
	reason := protocol.PeerText(m.Message, 300)
	a.jobsMu.Lock()
	defer a.jobsMu.Unlock()
	j, err := a.cfg.Store.GetJob(ctx, m.Job)
	if err != nil || j.Runner != lv.peer.Runner {
		log.Warn("runner refused a job the app did not give it", zap.Error(err))
		return
	}
	if j.State != JobDispatched {
		log.Warn("runner refused a job that is not waiting for its answer; ignored", zap.String("state", string(j.State)))
		return
	}
	switch m.Code {
	case protocol.RefusedFull, protocol.RefusedDraining:
		lv.mu.Lock()
		lv.hold = true
		lv.mu.Unlock()
		if j.CancelRequested {
			err = a.endLocked(ctx, j, protocol.StatusCanceled, "canceled before the runner started it")
			break
		}
		j.State = JobQueued
		j.DispatchedAt = time.Time{}
		j.Message = fmt.Sprintf(waitingPrefix+"runner %q refused it for now (%s: %s)", j.Runner, m.Code, reason)
		if err = a.cfg.Store.UpdateJob(ctx, j); err == nil {
			a.changed(j.ID)
			log.Info("runner refused the job for now; it waits in the queue", zap.String("message", reason))
		}
	default:
		err = a.endLocked(ctx, j, protocol.StatusError, fmt.Sprintf("runner %q refused the job (%s): %s", j.Runner, m.Code, reason))
	}
	if err != nil {
		log.Error("storing a refused job failed", zap.Error(err))
	}
}
