package spool

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// syncQueue is the group commit's state: the batch that the syncer's next pass makes
// durable, and how the syncer is woken and stopped.
type syncQueue struct {
	mu         sync.Mutex // guards next only; no other lock is taken while it is held
	next       *batch     // the batch the syncer's next pass makes durable
	kick       chan struct{}
	appending  atomic.Int64  // Appends under way; the syncer waits briefly for them to join
	arrived    chan struct{} // signalled when an Append joins a batch or returns
	lastSync   time.Duration // how long the last pass's syncs took; the syncer's own
	stop       chan struct{}
	syncerDone chan struct{}
}

// batch is one group commit: the jobs written since the syncer's last pass. done is closed
// when the pass that took the batch has synced them (or failed to).
type batch struct {
	jobs  map[*job]struct{}
	joins int64 // Appends waiting on this batch
	done  chan struct{}
}

func newBatch() *batch {
	return &batch{jobs: make(map[*job]struct{}), done: make(chan struct{})}
}

// join adds j, just written, to the next pass and wakes the syncer. The write happened before
// the join, and the pass reads each job's position after taking the batch, so the pass covers
// the write.
func (s *Spool) join(j *job) *batch {
	s.syncQueue.mu.Lock()
	b := s.next
	b.jobs[j] = struct{}{}
	b.joins++
	s.syncQueue.mu.Unlock()
	s.signal(s.kick) // if a pass is already due, it takes this batch
	s.signal(s.arrived)
	return b
}

// signal is a coalescing, non-blocking send on a 1-buffered channel.
func (s *Spool) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// syncer runs until Close. Close stops it only after every Append has returned, so no batch
// is left with a waiter.
func (s *Spool) syncer() {
	defer close(s.syncerDone)
	for {
		select {
		case <-s.kick:
			s.commit()
		case <-s.stop:
			return
		}
	}
}

// maxGather bounds how long a pass waits for Appends under way to join it.
const maxGather = time.Millisecond

// gather waits, before a pass takes its batch, until every Append under way has joined it,
// for at most half the last pass's sync time (and maxGather). Without it, appenders split into
// two cohorts that take turns: those woken by one pass write their next record while the other
// cohort's pass runs, and each pass covers half of them. The wait ends at once for appenders
// that are not under way, so a lone appender never waits, and it costs at most a fraction of
// the sync it saves.
func (s *Spool) gather() {
	wait := min(s.lastSync/2, maxGather)
	if wait <= 0 {
		return
	}
	var timer *time.Timer
	for {
		s.syncQueue.mu.Lock()
		joined := s.next.joins
		s.syncQueue.mu.Unlock()
		if joined >= s.appending.Load() {
			break
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		select {
		case <-s.arrived:
		case <-timer.C:
			return
		}
	}
}

// target is one job file in a pass: where the file stood when the pass took it.
type target struct {
	j       *job
	f       *os.File
	seq     int64
	size    int64
	epoch   uint64
	newFile bool
	err     error
}

// commit is one pass: it takes the pending batch, fsyncs each of its files once (and the
// directory, if a file in it is new), then marks what was synced durable and releases the
// waiters. Appends that arrive meanwhile gather in the next batch, so however many there are,
// they cost one more pass.
func (s *Spool) commit() {
	s.gather()
	s.syncQueue.mu.Lock()
	b := s.next
	s.next = newBatch()
	s.syncQueue.mu.Unlock()
	defer close(b.done)

	targets := make([]target, 0, len(b.jobs))
	for j := range b.jobs {
		j.mu.Lock()
		if j.removed || j.f == nil || j.size == j.durableSize && !j.needDirSync {
			j.mu.Unlock() // an earlier pass covered this write already
			continue
		}
		targets = append(targets, target{j: j, f: j.f, seq: j.lastSeq, size: j.size, epoch: j.epoch, newFile: j.needDirSync})
		j.fdMu.Lock() // until the fsync is done: Ack must not close the file under it
		j.mu.Unlock()
	}
	if len(targets) == 0 {
		return
	}

	started := time.Now()
	s.syncAll(targets)
	newFiles := false
	for _, t := range targets {
		newFiles = newFiles || t.newFile && t.err == nil
	}
	var dirErr error
	if newFiles {
		dirErr = s.syncDir()
	}
	s.lastSync = time.Since(started)

	var failed error
	advanced := false
	for _, t := range targets {
		err := t.err
		if err == nil && t.newFile {
			err = dirErr
		}
		j := t.j
		j.mu.Lock()
		if j.removed || j.epoch != t.epoch {
			j.mu.Unlock()
			continue
		}
		if err != nil {
			failed = err
			s.cut(j, s.explain(err))
		} else {
			advanced = advanced || t.seq > j.durableSeq
			j.durableSeq, j.durableSize = t.seq, t.size
			if t.newFile {
				j.needDirSync = false
			}
			if j.endSeq != 0 && j.endSeq <= j.durableSeq {
				j.closeEnded()
			}
		}
		j.mu.Unlock()
	}
	// A pass that succeeds does not clear an earlier failure: a small record may still fit on a
	// nearly full disk where a full batch does not. Only Healthy's full-size test write says
	// the spool can take records again.
	if failed != nil {
		s.setHealth(failed)
	}
	if advanced {
		s.commits.Add(1)
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
}

// maxParallelSyncs bounds the fsyncs one pass runs at once. Files are synced side by side
// because the file system merges concurrent syncs into fewer journal commits and device
// flushes: on ext4, eight files synced together took about a third of the time of eight in
// a row. The bound keeps a spool of hundreds of jobs from starting hundreds of goroutines.
const maxParallelSyncs = 16

// syncAll fsyncs every target's file, filling in t.err, and releases each file's fdMu.
func (s *Spool) syncAll(targets []target) {
	one := func(t *target) {
		if !s.noSync {
			s.syncs.Add(1)
			t.err = s.fsync(t.f)
		}
		t.j.fdMu.Unlock()
	}
	if len(targets) == 1 {
		one(&targets[0])
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(targets), maxParallelSyncs) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(targets)); i = next.Add(1) - 1 {
				one(&targets[i])
			}
		})
	}
	wg.Wait()
}

// cut undoes every record of j written after its last durable one, because a sync failed: on
// Linux a failed fsync may drop the dirty pages, so those bytes may never reach the disk, and a
// later record written after them would sit beyond a hole. Their Appends, waiting in this pass
// or the next, see the epoch change and report the failure; the seqs are used again. j.mu is
// held.
func (s *Spool) cut(j *job, err error) {
	j.syncErr = err
	j.epoch++
	if j.size > j.durableSize {
		if terr := j.f.Truncate(j.durableSize); terr != nil && j.broken == nil {
			j.broken = fmt.Errorf("spool file %s could not be cut back to its last durable record (%v); restart the RTE to repair it: %w", j.path, terr, err)
			s.log.Error("spool file could not be cut back after a failed sync; no more records for this job until a restart repairs it",
				zap.String("file", j.path), zap.NamedError("sync_error", err), zap.Error(terr))
		}
	}
	j.size = j.durableSize
	j.offs = j.offs[:max(0, j.durableSeq-j.base+1)]
	j.ats = j.ats[:len(j.offs)]
	j.lastSeq = j.durableSeq
	if j.endSeq > j.durableSeq {
		j.endSeq = 0
	}
}
