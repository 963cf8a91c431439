package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// ErrJobEnded is returned by Cancel for a job that has already ended.
var ErrJobEnded = errors.New("job has already ended")

// ErrRefused is wrapped by the errors of requests the app turns down as they stand, such as a job
// for a runner still in database mode; the error is a *RefusedError whose text says what to
// change.
var ErrRefused = errors.New("refused")

// Why Submit queued nothing, for errors.Is. A runner that does not exist is ErrNotFound, a job
// id already taken ErrExists; anything else is the store's.
var (
	// ErrInvalidJob: the job breaks the protocol's contract (protocol.JobStart.Validate: the
	// field and the reason are in the *protocol.FieldError that errors.As finds) or is too
	// large for one message. The RTE would refuse it the same way; nothing was stored.
	ErrInvalidJob = errors.New("invalid job")
	// ErrNotApproved: the runner is waiting for an admin (for the first time, or again after
	// its certificate changed) or was rejected. The error is a *RefusedError whose State says
	// where the runner stands.
	ErrNotApproved = errors.New("runner is not approved")
	// ErrNoFiles: the runner takes its files from the app (RTE_FILES=transfer), and the job
	// names no bundles and the app has no bundle source (Config.Files).
	ErrNoFiles = errors.New("no files to send to the runner")
)

// RefusedError is a request turned down as it stands. It reads as its message alone, which
// says what to change, and errors.Is matches ErrRefused and its Reason.
type RefusedError struct {
	Runner string // the runner the request was for
	State  State  // the runner's state when it was refused
	// Reason is ErrNotApproved or ErrNoFiles, or nil for the other refusals (a runner still in
	// database mode, secrets for a runner whose socket a node without the secret key holds).
	Reason error
	msg    string
}

func (e *RefusedError) Error() string { return e.msg }

func (e *RefusedError) Unwrap() []error {
	if e.Reason == nil {
		return []error{ErrRefused}
	}
	return []error{ErrRefused, e.Reason}
}

func refusal(r *Runner, reason error, format string, args ...any) error {
	return &RefusedError{Runner: r.Name, State: r.State, Reason: reason, msg: fmt.Sprintf(format, args...)}
}

// invalidJob marks a validation error as ErrInvalidJob, reading as the error alone.
type invalidJob struct{ err error }

func (e invalidJob) Error() string   { return e.err.Error() }
func (e invalidJob) Unwrap() []error { return []error{ErrInvalidJob, e.err} }

// Submit checks req, stores the job as queued and wakes the dispatch of its runner, on this app
// node or the one holding the runner's socket. It returns the job as stored, or why it queued
// nothing: ErrInvalidJob when the job fails protocol.JobStart.Validate once an id is assigned
// (errors.As finds the *protocol.FieldError), ErrNotFound for an unknown runner, a
// *RefusedError (ErrRefused) for a runner that cannot take it as it stands: not approved
// (ErrNotApproved), taking files the app cannot send (ErrNoFiles), or in database mode. Secrets
// stay in this process's memory, and with Config.SecretKey they are stored sealed as well; see
// JobRequest.
func (a *App) Submit(ctx context.Context, req JobRequest) (*Job, error) {
	start := cloneStart(req.JobStart)
	if start.Job == "" {
		start.Job = newJobID()
	}
	if err := start.Validate(); err != nil {
		return nil, fmt.Errorf("submit job %q: %w", protocol.PeerText(start.Job, 128), invalidJob{err})
	}
	// The encoded size is bounded by the message limit, so a job the RTE could not even read
	// fails here, not at dispatch. Sealing grows each secret a little; leave room for that.
	if b, err := protocol.Encode(start); err != nil {
		return nil, fmt.Errorf("submit job %q: %w", start.Job, invalidJob{err})
	} else if len(b) > protocol.MaxMessageBytes-64<<10 {
		return nil, fmt.Errorf("submit job %q: %w", start.Job, invalidJob{fmt.Errorf("job.start would be %d bytes, the limit is %d: move large extravars into the inventory or the repository", len(b), protocol.MaxMessageBytes)})
	}
	r, err := a.cfg.Store.GetRunner(ctx, req.Runner)
	if err != nil {
		return nil, fmt.Errorf("submit job %q: %w", start.Job, err)
	}
	if r.State != StateApproved {
		return nil, refusal(r, ErrNotApproved, "submit job %q: runner %q is %s, not approved: approve it first", start.Job, r.Name, r.State)
	}
	if r.Mode == ModeDatabase {
		return nil, refusal(r, nil, "submit job %q: runner %q is still in database mode, which is gone: it takes no jobs until its RTE signs in over a socket (docs/migration-from-database-mode.md)", start.Job, r.Name)
	}
	// The RTE refuses an image it does not run, but only once the job reached it, ending it
	// error; refusing here tells the submitter at once. A runner that listed no images either
	// runs processes (its RTE refuses any image, saying so) or was not heard since images were
	// stored: then the RTE alone decides.
	if start.Image != "" && len(r.Images) > 0 && !protocol.ImageAllowed(r.Images, start.Image) {
		return nil, fmt.Errorf("submit job %q: %w", start.Job, invalidJob{fmt.Errorf("image: runner %q does not run %s: its RTE allows %s (RTE_IMAGE, RTE_IMAGES_ALLOW); name one of those, or leave image out for the runner's default", r.Name, start.Image, strings.Join(r.Images, ", "))})
	}
	if r.Files == protocol.FilesTransfer && start.Files == nil && a.cfg.Files == nil {
		return nil, refusal(r, ErrNoFiles, "submit job %q: runner %q takes files from the app (RTE_FILES=transfer), and the job names no bundles nor has the app a bundle source (Config.Files): give files, or set RTE_FILES=local on the runner", start.Job, r.Name)
	}
	secrets := start.Secrets
	start.Secrets = nil
	sealed, err := a.sealForStore(start.Job, r, secrets)
	if err != nil {
		return nil, fmt.Errorf("submit job %q: %w", start.Job, err)
	}
	j := &Job{
		ID:            start.Job,
		Runner:        r.Name,
		Start:         start,
		SecretNames:   slices.Sorted(maps.Keys(secrets)),
		SealedSecrets: sealed,
		SubmitNode:    a.cfg.Node,
		State:         JobQueued,
		CreatedAt:     a.cfg.Now(),
	}
	if len(j.SecretNames) == 0 {
		j.SecretNames = nil
	}
	// Dispatch reads a job and its secrets under jobsMu, so holding it here means no dispatch
	// sees the job before its secrets are in memory (it would take them for lost in a restart),
	// and a duplicate id never replaces the secrets of the job that has it.
	a.jobsMu.Lock()
	err = a.cfg.Store.CreateJob(ctx, j)
	if err == nil && len(secrets) > 0 {
		a.keepSecrets(j.ID, secrets)
	}
	a.jobsMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("submit job %q: %w", j.ID, err)
	}
	a.log.Info("job queued",
		zap.String("job", j.ID),
		zap.String("runner", j.Runner),
		zap.String("playbook", protocol.PeerText(j.Start.Playbook, 200)),
		zap.Strings("secrets", j.SecretNames))
	a.changed(j.ID)
	a.wakeHolder(ctx, j.Runner)
	return j.Clone(), nil
}

// newJobID returns 24 random hex digits: unguessable, so a job id in a URL reveals no others.
func newJobID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Cancel stops a job. A queued job ends canceled at once. A dispatched or running one gets
// job.cancel on its runner's socket (now, or when the runner reconnects) and ends when the
// runner's end record arrives. A job that has ended gives an error wrapping ErrJobEnded.
func (a *App) Cancel(ctx context.Context, jobID string) error {
	a.jobsMu.Lock()
	j, err := a.cfg.Store.GetJob(ctx, jobID)
	if err != nil {
		a.jobsMu.Unlock()
		return fmt.Errorf("cancel job %q: %w", jobID, err)
	}
	switch j.State {
	case JobEnded:
		a.jobsMu.Unlock()
		return fmt.Errorf("cancel job %q: %w (status %s)", jobID, ErrJobEnded, j.Status)
	case JobQueued:
		err := a.endLocked(ctx, j, protocol.StatusCanceled, "canceled before it was dispatched to a runner")
		a.jobsMu.Unlock()
		if err != nil {
			return fmt.Errorf("cancel job %q: %w", jobID, err)
		}
		return nil
	}
	first := !j.CancelRequested
	j.CancelRequested = true
	err = a.cfg.Store.UpdateJob(ctx, j)
	a.jobsMu.Unlock()
	if err != nil {
		return fmt.Errorf("cancel job %q: %w", jobID, err)
	}
	if first {
		a.log.Info("job cancel requested", zap.String("job", j.ID), zap.String("runner", j.Runner), zap.String("state", string(j.State)))
		a.changed(j.ID)
	}
	// A socket that is down or drops now loses nothing: the reconnect sends job.cancel again.
	if lv := a.liveRunner(j.Runner); lv != nil {
		_ = lv.peer.Send(ctx, protocol.JobCancel{Job: j.ID})
	} else {
		a.wakeHolder(ctx, j.Runner) // another app node may hold the socket
	}
	return nil
}

// GetJob returns the job, or an error wrapping ErrNotFound.
func (a *App) GetJob(ctx context.Context, id string) (*Job, error) {
	j, err := a.cfg.Store.GetJob(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("get job %q: %w", id, err)
	}
	return j, nil
}

// ListJobs returns the jobs f selects, newest first.
func (a *App) ListJobs(ctx context.Context, f JobFilter) ([]*Job, error) {
	jobs, err := a.cfg.Store.ListJobs(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return jobs, nil
}

// Records returns the job's stored records with seq > after, in order, at most limit (<= 0:
// all). Follow a job with Watch and Records(after = the last seq seen): nothing is skipped.
func (a *App) Records(ctx context.Context, job string, after int64, limit int) ([]protocol.Record, error) {
	recs, err := a.cfg.Store.Records(ctx, job, after, limit)
	if err != nil {
		return nil, fmt.Errorf("records of job %q: %w", job, err)
	}
	return recs, nil
}

// watcher is one Watch caller's signal channel.
type watcher struct{ ch chan struct{} }

// Watch returns a channel that receives a value, coalesced, whenever records of job are stored
// or its state changes, for live following: after each signal read GetJob and Records. The
// channel is never closed; stop releases it and may be called more than once.
func (a *App) Watch(job string) (ch <-chan struct{}, stop func()) {
	w := &watcher{ch: make(chan struct{}, 1)}
	a.watchMu.Lock()
	set := a.watchers[job]
	if set == nil {
		set = map[*watcher]struct{}{}
		a.watchers[job] = set
	}
	set[w] = struct{}{}
	a.watchMu.Unlock()
	return w.ch, func() {
		a.watchMu.Lock()
		defer a.watchMu.Unlock()
		if set := a.watchers[job]; set != nil {
			delete(set, w)
			if len(set) == 0 {
				delete(a.watchers, job)
			}
		}
	}
}

// changed signals the job's watchers without blocking: a watcher that has not read the last
// signal yet has one pending, which is all it needs.
func (a *App) changed(job string) {
	a.watchMu.Lock()
	defer a.watchMu.Unlock()
	for w := range a.watchers[job] {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}

// endLocked ends j with status and message, stamped with the app's clock, and forgets its
// secrets. The caller holds jobsMu.
func (a *App) endLocked(ctx context.Context, j *Job, status, message string) error {
	j.State = JobEnded
	j.Status = status
	j.Message = message
	j.EndedAt = a.cfg.Now()
	if err := a.cfg.Store.UpdateJob(ctx, j); err != nil {
		return err
	}
	a.dropSecrets(j.ID)
	a.log.Info("job ended by the app",
		zap.String("job", j.ID),
		zap.String("runner", j.Runner),
		zap.String("status", status),
		zap.String("message", message))
	a.changed(j.ID)
	return nil
}

func (a *App) keepSecrets(job string, secrets map[string]string) {
	a.secretsMu.Lock()
	defer a.secretsMu.Unlock()
	a.secrets[job] = maps.Clone(secrets)
}

func (a *App) dropSecrets(job string) {
	a.secretsMu.Lock()
	defer a.secretsMu.Unlock()
	delete(a.secrets, job)
}

func (a *App) heldSecrets(job string) (map[string]string, bool) {
	a.secretsMu.Lock()
	defer a.secretsMu.Unlock()
	s, ok := a.secrets[job]
	return s, ok
}

// secretsLost says why j cannot be dispatched any more, or "" when it can: its secrets are
// neither in this process's memory nor in a sealed copy this node can open (secretsOf).
func (a *App) secretsLost(j *Job) string {
	if len(j.SecretNames) == 0 {
		return ""
	}
	_, why := a.secretsOf(j)
	return why
}

// sealedStart is the job.start to send for j: the stored start with each secret sealed for
// this job with the runner's token.
func (a *App) sealedStart(j *Job, token string) (protocol.JobStart, error) {
	start := cloneStart(j.Start)
	start.Job = j.ID
	start.Secrets = nil
	if len(j.SecretNames) == 0 {
		return start, nil
	}
	plain, _ := a.secretsOf(j)
	start.Secrets = make(map[string]string, len(plain))
	for _, name := range j.SecretNames {
		sealed, err := protocol.SealSecret(token, j.ID, plain[name])
		if err != nil {
			// The error comes from the crypto library and names no value.
			return start, fmt.Errorf("seal secret %s of job %q: %w", name, j.ID, err)
		}
		start.Secrets[name] = sealed
	}
	return start, nil
}
