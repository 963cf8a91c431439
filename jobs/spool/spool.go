package spool

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// ErrClosed is returned by calls on a closed Spool.
var ErrClosed = errors.New("spool is closed")

// Options tune a Spool. The zero value is ready for production.
type Options struct {
	Logger *zap.Logger // named "spool" here; nil logs nothing
	// Now stamps records (the "at" key, RFC 3339 with nanoseconds, UTC); default time.Now.
	Now func() time.Time
	// NoSync skips every fsync. For tests and benchmarks only, never in production: with it a
	// record reported durable can vanish in a power loss.
	NoSync bool
	// RetryEvery is how often Healthy, while it reports an error, tries a test write to see
	// whether the disk has room again; default 5s. Without it a spool that filled up would stay
	// unhealthy until an Append succeeded, and an RTE refusing jobs while unhealthy appends
	// nothing.
	RetryEvery time.Duration

	// fsync replaces (*os.File).Sync, so tests can make a sync fail.
	fsync func(*os.File) error
}

// JobState is one job as the spool holds it. LastSeq and Ended count only durable records.
type JobState struct {
	Job     string
	LastSeq int64 // highest durable seq
	Acked   int64 // highest seq the app acknowledged since Open
	Ended   bool  // the end record is durable
	// WaitingBytes is the size in the file of the durable records after Acked, framing
	// included; OldestWaiting is the At of the first of them (zero when none waits).
	WaitingBytes  int64
	OldestWaiting time.Time
}

// Stats are counters since Open, for metrics and benchmarks.
type Stats struct {
	Records int64 // records written
	Bytes   int64 // bytes written to job files, framing included
	Syncs   int64 // fsync calls on job files and the directory
	Commits int64 // syncer passes that made at least one record durable
}

// Spool is the set of job files in one directory. It is safe for concurrent use.
//
// Its state comes in groups, each guarded by its own mutex so that appends, acks, the syncer
// and health checks of different jobs do not wait on one another. Lock order: jobTable.mu, then
// a job's mu, then that job's fdMu (the syncer takes fdMu under the job's mu and holds it over
// the fsync). syncQueue.mu and healthState.mu are leaves: no other lock is taken while one of
// them is held, and neither is taken under another.
type Spool struct {
	dir string
	log *zap.Logger
	now func() time.Time

	disk
	jobTable
	syncQueue
	healthState
	counters

	changed chan struct{} // see Changed
}

// disk is how the spool touches its directory. It is set by Open and not changed after, so it
// needs no lock.
type disk struct {
	noSync   bool
	fsync    func(*os.File) error
	lockFile *os.File // holds the flock that keeps a second process out
	dirFile  *os.File // synced after a job file is created
}

// jobTable is which jobs the spool holds, and whether it still takes calls.
type jobTable struct {
	mu        sync.Mutex // guards jobs, closed and the ended ring; taken before any job's mu
	jobs      map[string]*job
	closed    bool
	ended     map[string]struct{} // recently removed jobs: appending to one is a caller bug
	endedRing []string
	inflight  sync.WaitGroup // Append and Ack calls in progress; Close waits for them
}

// counters are Stats, updated without a lock.
type counters struct {
	records, bytes, syncs, commits atomic.Int64
}

// Open opens dir as a spool, creating it (mode 0700) if needed, and restores every job file in
// it: each frame's checksum and sequence is checked and a torn or corrupt tail (a crash
// mid-write) is cut off and logged. A file that does not start with the spool header stops
// Open: it is not the spool's, and deleting it is the operator's call. Open takes an exclusive
// lock on dir, so two RTEs sharing one RTE_SPOOL_PATH fail fast instead of mixing records.
func Open(dir string, opts Options) (*Spool, error) {
	log := zap.NewNop()
	if opts.Logger != nil {
		log = opts.Logger.Named("spool")
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	if opts.RetryEvery <= 0 {
		opts.RetryEvery = defaultRetryEvery
	}
	if opts.fsync == nil {
		opts.fsync = (*os.File).Sync
	}
	s := &Spool{
		dir:  dir,
		log:  log,
		now:  now,
		disk: disk{noSync: opts.NoSync, fsync: opts.fsync},
		jobTable: jobTable{
			jobs:  make(map[string]*job),
			ended: make(map[string]struct{}),
		},
		syncQueue: syncQueue{
			next:       newBatch(),
			kick:       make(chan struct{}, 1),
			arrived:    make(chan struct{}, 1),
			stop:       make(chan struct{}),
			syncerDone: make(chan struct{}),
		},
		healthState: healthState{retryEvery: opts.RetryEvery},
		changed:     make(chan struct{}, 1),
	}
	if err := s.openDir(); err != nil {
		s.closeDir()
		return nil, err
	}
	if err := s.restore(); err != nil {
		for _, j := range s.jobs {
			if j.f != nil {
				j.f.Close()
			}
		}
		s.closeDir()
		return nil, err
	}
	go s.syncer()
	return s, nil
}

// Stats returns counters since Open.
func (s *Spool) Stats() Stats {
	return Stats{Records: s.records.Load(), Bytes: s.bytes.Load(), Syncs: s.syncs.Load(), Commits: s.commits.Load()}
}

// Close waits for Appends and Acks in progress, stops the syncer, closes every file and
// releases the directory. A Pending walk in progress keeps its own descriptor and may finish.
// Calls after Close return ErrClosed; a second Close returns nil.
func (s *Spool) Close() error {
	s.jobTable.mu.Lock()
	if s.closed {
		s.jobTable.mu.Unlock()
		return nil
	}
	s.closed = true
	s.jobTable.mu.Unlock()
	s.inflight.Wait()
	close(s.stop)
	<-s.syncerDone

	var errs []error
	for _, j := range s.jobs {
		j.mu.Lock()
		if j.f != nil {
			if err := j.f.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close spool file %s: %w", j.path, err))
			}
			j.f = nil
		}
		j.mu.Unlock()
	}
	s.closeDir()
	return errors.Join(errs...)
}
