package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rte-project/rte/protocol"
)

// ErrNotFound is returned for a runner or job the store does not hold.
var ErrNotFound = errors.New("not found")

// ErrExists is returned when adding a runner or job whose name is taken.
var ErrExists = errors.New("already exists")

// Store keeps runners, jobs and their records. Each call is atomic on its own; the App
// serialises its read-modify-write sequences itself, so a store needs no transactions across
// calls. Implementations must return and keep copies: a *Runner or *Job handed in or out must
// not alias the stored one. All methods are safe for concurrent use.
//
// Several app nodes may share one store (docs/app-nodes.md). Their read-modify-write sequences
// are not serialised with each other, so UpdateJob keeps three rules that stop one node from
// undoing another's change: an ended job stays ended, a requested cancel stays requested, and
// sealed secrets outlive neither. Leases (ClaimLeases) decide which node holds each runner's
// socket.
//
// The memory store (NewMemoryStore), package sqlitestore and package pgstore implement it;
// all pass the same conformance suite, package storetest, which a new store runs too.
type Store interface {
	// GetRunner returns the named runner, or an error wrapping ErrNotFound.
	GetRunner(ctx context.Context, name string) (*Runner, error)
	// PutRunner creates or replaces the runner named r.Name.
	PutRunner(ctx context.Context, r *Runner) error
	// DeleteRunner removes the named runner; an error wrapping ErrNotFound if there is none.
	DeleteRunner(ctx context.Context, name string) error
	// ListRunners returns every runner, in name order.
	ListRunners(ctx context.Context) ([]*Runner, error)

	// CreateJob stores a new job; an error wrapping ErrExists when its id is taken. j.LastSeq
	// and j.Start.Secrets are not stored.
	CreateJob(ctx context.Context, j *Job) error
	// GetJob returns the job, or an error wrapping ErrNotFound.
	GetJob(ctx context.Context, id string) (*Job, error)
	// UpdateJob replaces every field of the stored job but LastSeq, which only StoreRecords
	// moves (so an update computed from an older read cannot move it back); an error wrapping
	// ErrNotFound if there is no such job. Whatever the update says, a job stored as ended is
	// not changed (an error wrapping ErrJobEnded), CancelRequested never goes back to false, and
	// SealedSecrets are kept only while the job is queued or dispatched.
	UpdateJob(ctx context.Context, j *Job) error
	// ListJobs returns the jobs the filter selects, newest (CreatedAt) first.
	ListJobs(ctx context.Context, f JobFilter) ([]*Job, error)

	// StoreRecords stores recs in ONE transaction, each (job, seq) at most once: a record
	// already stored is ignored, the first copy stays. It returns, per job touched, the
	// highest seq n such that every seq 1..n is stored: the cumulative ack to send. Only
	// after it returns (committed, durable) may that ack be sent. Every record's job must
	// exist (CreateJob); otherwise it returns an error wrapping ErrNotFound and stores nothing.
	StoreRecords(ctx context.Context, recs []protocol.Record) (map[string]int64, error)
	// Records returns the job's records with after < seq <= LastSeq, in seq order, at most
	// limit of them (limit <= 0: all); an error wrapping ErrNotFound for an unknown job.
	// Records past a gap wait until the gap is filled, so a reader that follows a job with
	// after = the last seq it saw misses nothing.
	Records(ctx context.Context, job string, after int64, limit int) ([]protocol.Record, error)

	// ClaimLeases takes or renews, in ONE transaction, the leases of the claimed runners for the
	// app instance (node, instance), each a compare-and-set: a claim wins when the runner has no
	// lease, when its lease is the instance's own, when it expired at now, or when the claim
	// forces it. A won lease runs until expires with the claim's Connected and keeps its Wake;
	// a lost one is left alone. It returns every claimed runner's lease as stored afterwards,
	// in claim order: the instance holds those whose Instance is its own. Times come from the
	// caller, so every node sharing a store needs a synchronised clock (NTP), with a skew far
	// below the lease's length.
	ClaimLeases(ctx context.Context, node, instance string, claims []LeaseClaim, now, expires time.Time) ([]Lease, error)
	// ReleaseLeases frees the instance's leases of the runners (all of them when runners is
	// nil), so another node may take them at once; leases others hold are left alone.
	ReleaseLeases(ctx context.Context, instance string, runners []string) error
	// Leases returns every lease, free ones included, in runner order.
	Leases(ctx context.Context) ([]Lease, error)
	// WakeHolder raises the Wake of the runner's lease (a free lease is made when there is
	// none), which tells the node holding the runner's socket to look at the store again.
	WakeHolder(ctx context.Context, runner string) error
}

// NewMemoryStore returns a Store that keeps everything in memory, for tests and for an app
// that re-seeds its runners at every start and may lose its jobs. It is safe for concurrent use.
func NewMemoryStore() Store {
	return &memoryStore{
		runners: map[string]*Runner{},
		jobs:    map[string]*Job{},
		records: map[string]map[int64]protocol.Record{},
	}
}

type memoryStore struct {
	mu      sync.Mutex
	runners map[string]*Runner
	jobs    map[string]*Job
	records map[string]map[int64]protocol.Record // job -> seq -> record
	leases  map[string]Lease                     // by runner (lease.go)
}

func (s *memoryStore) GetRunner(_ context.Context, name string) (*Runner, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.runners[name]
	if !ok {
		return nil, fmt.Errorf("runner %q: %w", name, ErrNotFound)
	}
	return r.Clone(), nil
}

func (s *memoryStore) PutRunner(_ context.Context, r *Runner) error {
	if r == nil || r.Name == "" {
		return errors.New("put runner: the runner has no name")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runners[r.Name] = r.Clone()
	return nil
}

func (s *memoryStore) DeleteRunner(_ context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.runners[name]; !ok {
		return fmt.Errorf("runner %q: %w", name, ErrNotFound)
	}
	delete(s.runners, name)
	return nil
}

func (s *memoryStore) ListRunners(context.Context) ([]*Runner, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Runner, 0, len(s.runners))
	for _, r := range s.runners {
		out = append(out, r.Clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s *memoryStore) CreateJob(_ context.Context, j *Job) error {
	if j == nil || j.ID == "" {
		return errors.New("create job: the job has no id")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.jobs[j.ID]; ok {
		return fmt.Errorf("job %q: %w", j.ID, ErrExists)
	}
	c := j.Clone()
	c.Start.Secrets = nil
	c.LastSeq = 0
	keepSealedWhileUnsent(c)
	s.jobs[j.ID] = c
	return nil
}

func (s *memoryStore) GetJob(_ context.Context, id string) (*Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok {
		return nil, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	return j.Clone(), nil
}

func (s *memoryStore) UpdateJob(_ context.Context, j *Job) error {
	if j == nil {
		return errors.New("update job: no job given")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.jobs[j.ID]
	if !ok {
		return fmt.Errorf("job %q: %w", j.ID, ErrNotFound)
	}
	if old.State == JobEnded {
		return fmt.Errorf("update job %q: %w", j.ID, ErrJobEnded)
	}
	c := j.Clone()
	c.Start.Secrets = nil
	c.LastSeq = old.LastSeq
	c.CancelRequested = c.CancelRequested || old.CancelRequested
	keepSealedWhileUnsent(c)
	s.jobs[j.ID] = c
	return nil
}

// keepSealedWhileUnsent drops a job's sealed secrets once it is past dispatch: the runner has
// the job, or it ended, and nothing sends its job.start again.
func keepSealedWhileUnsent(j *Job) {
	if j.State != JobQueued && j.State != JobDispatched {
		j.SealedSecrets = nil
	}
}

func (s *memoryStore) ListJobs(_ context.Context, f JobFilter) ([]*Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Job
	for _, j := range s.jobs {
		if f.matches(j) {
			out = append(out, j.Clone())
		}
	}
	sortNewestFirst(out)
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// sortNewestFirst orders jobs by CreatedAt, newest first, and by id among equal times, so a
// listing is stable when a clock's resolution puts several jobs at one instant.
func sortNewestFirst(jobs []*Job) {
	sort.Slice(jobs, func(a, b int) bool {
		if !jobs[a].CreatedAt.Equal(jobs[b].CreatedAt) {
			return jobs[a].CreatedAt.After(jobs[b].CreatedAt)
		}
		return jobs[a].ID > jobs[b].ID
	})
}

func (s *memoryStore) StoreRecords(_ context.Context, recs []protocol.Record) (map[string]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range recs {
		if _, ok := s.jobs[r.Job]; !ok {
			return nil, fmt.Errorf("store records: job %q: %w", r.Job, ErrNotFound)
		}
	}
	heads := map[string]int64{}
	for _, r := range recs {
		m := s.records[r.Job]
		if m == nil {
			m = map[int64]protocol.Record{}
			s.records[r.Job] = m
		}
		if _, dup := m[r.Seq]; !dup {
			r.Data = slices.Clone(r.Data)
			m[r.Seq] = r
		}
		heads[r.Job] = 0
	}
	for job := range heads {
		j := s.jobs[job]
		for {
			if _, ok := s.records[job][j.LastSeq+1]; !ok {
				break
			}
			j.LastSeq++
		}
		heads[job] = j.LastSeq
	}
	return heads, nil
}

func (s *memoryStore) Records(_ context.Context, job string, after int64, limit int) ([]protocol.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[job]
	if !ok {
		return nil, fmt.Errorf("records of job %q: %w", job, ErrNotFound)
	}
	var out []protocol.Record
	for seq := max(after, 0) + 1; seq <= j.LastSeq && (limit <= 0 || len(out) < limit); seq++ {
		r := s.records[job][seq]
		r.Data = slices.Clone(r.Data)
		out = append(out, r)
	}
	return out, nil
}

// The memory store's leases; see Store.

func (s *memoryStore) ClaimLeases(_ context.Context, node, instance string, claims []LeaseClaim, now, expires time.Time) ([]Lease, error) {
	if node == "" || instance == "" {
		return nil, errors.New("claim leases: node and instance are required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases == nil {
		s.leases = map[string]Lease{}
	}
	out := make([]Lease, 0, len(claims))
	for _, c := range claims {
		l, ok := s.leases[c.Runner]
		if !ok || l.Instance == "" || l.Instance == instance || !now.Before(l.Expires) || c.Force {
			l = Lease{Runner: c.Runner, Node: node, Instance: instance, Expires: expires, Connected: c.Connected, Wake: l.Wake}
			s.leases[c.Runner] = l
		}
		out = append(out, l)
	}
	return out, nil
}

func (s *memoryStore) ReleaseLeases(_ context.Context, instance string, runners []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := func(name string) {
		if l, ok := s.leases[name]; ok && l.Instance == instance {
			s.leases[name] = Lease{Runner: name, Wake: l.Wake}
		}
	}
	if runners == nil {
		for name := range s.leases {
			free(name)
		}
	}
	for _, name := range runners {
		free(name)
	}
	return nil
}

func (s *memoryStore) Leases(context.Context) ([]Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Lease, 0, len(s.leases))
	for _, l := range s.leases {
		out = append(out, l)
	}
	slices.SortFunc(out, func(x, y Lease) int { return strings.Compare(x.Runner, y.Runner) })
	return out, nil
}

func (s *memoryStore) WakeHolder(_ context.Context, runner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases == nil {
		s.leases = map[string]Lease{}
	}
	l, ok := s.leases[runner]
	if !ok {
		l = Lease{Runner: runner}
	}
	l.Wake++
	s.leases[runner] = l
	return nil
}
