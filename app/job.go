package app

import (
	"bytes"
	"maps"
	"slices"
	"time"

	"github.com/rte-project/rte/protocol"
)

// JobState is where a job stands on its way through a runner.
type JobState string

const (
	// JobQueued: stored, waiting for its runner to be connected and to have a free slot.
	JobQueued JobState = "queued"
	// JobDispatched: job.start was sent and the runner has not answered yet. A dispatched job
	// whose job.start was lost is sent again when the runner reconnects; the RTE never starts a
	// job twice, so sending again is safe.
	JobDispatched JobState = "dispatched"
	// JobRunning: the runner accepted the job (or sent its first record).
	JobRunning JobState = "running"
	// JobEnded: the job has its end: from the runner's end record, or from the app when the job
	// never reached the runner (queue timeout, refusal, cancel while queued).
	JobEnded JobState = "ended"
)

// JobRequest is what Submit needs to queue a job.
type JobRequest struct {
	Runner string
	// JobStart is the job as the runner will get it. Job may be empty: Submit assigns an id.
	// Secrets hold PLAINTEXT here (name -> value): Submit keeps them in memory only, and each
	// dispatch seals them with the runner's token (protocol.SealSecret). They are never stored
	// and never logged.
	protocol.JobStart
}

// Job is one job as the app stores it.
type Job struct {
	ID, Runner string
	// Start is the job.start as stored: WITHOUT secrets. A store drops Start.Secrets.
	Start protocol.JobStart
	// SecretNames names the secrets given at submit (vault_password, become_password); their
	// values live in the memory of the node that took the submit until the runner has the job.
	SecretNames []string
	State       JobState
	// CancelRequested is set when Cancel reached a job the runner may already have: the
	// runner's end record (status canceled) ends it, and job.cancel is sent again whenever the
	// runner reconnects still holding the job.
	CancelRequested bool
	Status          string // end status (protocol.Status*), "" until ended
	ExitCode        int
	// Message is the end message, or why the job failed before reaching the runner (queue
	// timeout, refused invalid...). While queued it says what the job waits for.
	Message string
	// CreatedAt, DispatchedAt and the app's own ends use the app's clock; StartedAt and an
	// EndedAt from an end record are the runner's clock, as the records carry it, so a socket
	// that was down for an hour does not move them.
	CreatedAt, DispatchedAt, StartedAt, EndedAt time.Time
	// LastSeq is the highest seq such that every record 1..LastSeq is stored. Only
	// StoreRecords moves it; UpdateJob leaves it alone.
	LastSeq int64

	// SealedSecrets holds the same secrets sealed with the app's secret key (Config.SecretKey;
	// name -> sealed value), so that any app node sharing the store can dispatch the job. Nil
	// when the app has no secret key. A store keeps them only while the job is queued or
	// dispatched: a runner that has the job never needs them again.
	SealedSecrets map[string]string
	// SubmitNode is the app node that took the submit (Config.Node), whose memory holds the
	// plaintext secrets.
	SubmitNode string
}

// Clone returns a deep copy, so that a caller's changes never reach a store's copy.
func (j *Job) Clone() *Job {
	c := *j
	c.Start = cloneStart(j.Start)
	c.SecretNames = slices.Clone(j.SecretNames)
	c.SealedSecrets = maps.Clone(j.SealedSecrets)
	return &c
}

func cloneStart(s protocol.JobStart) protocol.JobStart {
	c := s
	c.Inventories = slices.Clone(s.Inventories)
	if s.Files != nil {
		f := *s.Files
		f.Inventories = slices.Clone(s.Files.Inventories)
		c.Files = &f
	}
	c.Extravars = bytes.Clone(s.Extravars)
	c.Tags = slices.Clone(s.Tags)
	c.SkipTags = slices.Clone(s.SkipTags)
	c.Env = maps.Clone(s.Env)
	c.Secrets = maps.Clone(s.Secrets)
	return c
}

// JobFilter selects jobs for ListJobs. Zero values select everything.
type JobFilter struct {
	Runner string     // only this runner's jobs
	States []JobState // only jobs in one of these states
	Limit  int        // at most this many, newest first; 0 for all
}

// matches reports whether j passes the filter's runner and states (not the limit).
func (f JobFilter) matches(j *Job) bool {
	if f.Runner != "" && j.Runner != f.Runner {
		return false
	}
	return len(f.States) == 0 || slices.Contains(f.States, j.State)
}
