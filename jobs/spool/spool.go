package spool

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
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
type Spool struct {
	dir    string
	log    *zap.Logger
	now    func() time.Time
	noSync bool
	fsync  func(*os.File) error

	lockFile *os.File // holds the flock that keeps a second process out
	dirFile  *os.File // synced after a job file is created

	mu        sync.Mutex // guards jobs, closed and the ended ring; taken before any job.mu
	jobs      map[string]*job
	closed    bool
	ended     map[string]struct{} // recently removed jobs: appending to one is a caller bug
	endedRing []string
	inflight  sync.WaitGroup // Append and Ack calls in progress; Close waits for them

	syncMu     sync.Mutex // guards next
	next       *batch     // the batch the syncer's next pass makes durable
	kick       chan struct{}
	appending  atomic.Int64  // Appends under way; the syncer waits briefly for them to join
	arrived    chan struct{} // signalled when an Append joins a batch or returns
	lastSync   time.Duration // how long the last pass's syncs took; the syncer's own
	stop       chan struct{}
	syncerDone chan struct{}

	changed chan struct{}

	healthMu   sync.Mutex // guards health and lastProbe
	health     error
	lastProbe  time.Time
	retryEvery time.Duration

	records, bytes, syncs, commits atomic.Int64
}

// endedMemory is how many removed job ids are remembered to refuse a late Append. A late
// append comes right after the end, so a short memory is enough, and it stays bounded on an
// RTE that runs for months.
const endedMemory = 1024

// job is one job file and its index. Record bodies stay on disk; memory per job is the offsets
// of its unacknowledged records.
type job struct {
	id   string
	path string

	mu      sync.Mutex // guards every field below
	f       *os.File   // nil until the first Append creates the file, and again once the end is durable
	size    int64      // bytes written, durable or not
	lastSeq int64      // last seq written
	endSeq  int64      // seq of the end record, 0 before it is written
	// base is the seq of offs[0]; offs[i] is the file offset of record base+i. Acked records
	// are dropped from the front.
	base int64
	offs []int64
	// ats[i] is the time of record base+i (its At), for the age of the oldest unacked record.
	ats         []time.Time
	durableSeq  int64
	durableSize int64
	acked       int64
	needDirSync bool   // the file's directory entry is not yet durable
	epoch       uint64 // bumped when unsynced records are cut after a failed sync
	syncErr     error  // why the last cut happened
	broken      error  // a failed write or sync left bytes that could not be cut off; no more appends
	removed     bool

	// fdMu keeps Ack from closing the file while the syncer fsyncs it.
	fdMu sync.Mutex
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
		dir:        dir,
		log:        log,
		now:        now,
		noSync:     opts.NoSync,
		fsync:      opts.fsync,
		jobs:       make(map[string]*job),
		ended:      make(map[string]struct{}),
		next:       newBatch(),
		kick:       make(chan struct{}, 1),
		arrived:    make(chan struct{}, 1),
		stop:       make(chan struct{}),
		syncerDone: make(chan struct{}),
		changed:    make(chan struct{}, 1),
		retryEvery: opts.RetryEvery,
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

// openDir creates, checks and locks the directory.
func (s *Spool) openDir() error {
	created := false
	if _, err := os.Stat(s.dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return fmt.Errorf("create spool directory %s: %w", s.dir, err)
		}
		created = true
	}
	info, err := os.Stat(s.dir)
	if err != nil {
		return fmt.Errorf("open spool directory %s: %w", s.dir, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("spool path %s is not a directory: point RTE_SPOOL_PATH at a directory", s.dir)
	}
	if info.Mode().Perm()&0o077 != 0 {
		s.log.Warn("spool directory is open to its group or others; records hold job output, so make it 0700",
			zap.String("dir", s.dir), zap.String("mode", info.Mode().Perm().String()))
	}
	lockPath := filepath.Join(s.dir, "LOCK")
	lf, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open spool lock %s: %w", lockPath, err)
	}
	s.lockFile = lf
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("spool %s is in use by another process: give each RTE its own RTE_SPOOL_PATH", s.dir)
		}
		return fmt.Errorf("lock spool %s: %w", lockPath, err)
	}
	df, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("open spool directory %s: %w", s.dir, err)
	}
	s.dirFile = df
	if created {
		// The new directory's own entry lives in its parent; without this a power loss can
		// take the directory, and every file in it, away.
		if err := s.syncPath(filepath.Dir(filepath.Clean(s.dir))); err != nil {
			return err
		}
	}
	return nil
}

func (s *Spool) closeDir() {
	if s.dirFile != nil {
		s.dirFile.Close()
	}
	if s.lockFile != nil {
		s.lockFile.Close() // closing the last descriptor releases the flock
	}
}

func (s *Spool) syncPath(path string) error {
	if s.noSync {
		return nil
	}
	d, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open directory %s to sync it: %w", path, err)
	}
	defer d.Close()
	s.syncs.Add(1)
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", path, err)
	}
	return nil
}

func (s *Spool) syncDir() error {
	if s.noSync {
		return nil
	}
	s.syncs.Add(1)
	if err := s.fsync(s.dirFile); err != nil {
		return fmt.Errorf("sync spool directory %s: %w", s.dir, err)
	}
	return nil
}

// restore loads every job file in the directory.
func (s *Spool) restore() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("read spool directory %s: %w", s.dir, err)
	}
	dirChanged := false
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || filepath.Ext(name) != fileExt {
			continue
		}
		id := name[:len(name)-len(fileExt)]
		if !protocol.ValidJobID(id) {
			s.log.Warn("ignoring a file whose name is not a job id", zap.String("file", filepath.Join(s.dir, name)))
			continue
		}
		j, changed, err := s.restoreJob(id)
		if err != nil {
			return err
		}
		dirChanged = dirChanged || changed
		if j != nil {
			s.jobs[id] = j
		}
	}
	if dirChanged {
		return s.syncDir()
	}
	return nil
}

// restoreJob scans one job file, cutting a damaged tail. It returns nil for a file that held no
// record (a crash right after creating it), which it removes; changed reports a removal.
func (s *Spool) restoreJob(id string) (j *job, changed bool, err error) {
	path := filepath.Join(s.dir, id+fileExt)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return nil, false, fmt.Errorf("open spool file %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("stat spool file %s: %w", path, err)
	}
	j = &job{id: id, path: path, f: f, base: 1}
	if err := s.scan(j, info.Size()); err != nil {
		f.Close()
		return nil, false, err
	}
	if j.lastSeq == 0 {
		f.Close()
		if err := os.Remove(path); err != nil {
			return nil, false, fmt.Errorf("remove empty spool file %s: %w", path, err)
		}
		s.log.Info("removed a spool file that held no record (the RTE stopped while creating it)", zap.String("file", path))
		return nil, true, nil
	}
	j.durableSeq, j.durableSize = j.lastSeq, j.size
	if j.endSeq != 0 {
		j.closeEnded()
	}
	return j, false, nil
}

// scan reads j's file of the given size, filling j's index, and cuts the file at the first
// damaged frame.
func (s *Spool) scan(j *job, size int64) error {
	hdr := make([]byte, len(fileHeader))
	n, err := j.f.ReadAt(hdr, 0)
	if err != nil && n < len(hdr) && int64(n) < size {
		return fmt.Errorf("read spool file %s: %w", j.path, err)
	}
	if size < int64(len(fileHeader)) {
		if string(hdr[:n]) == fileHeader[:n] {
			return nil // a torn header: no record was ever written
		}
		return fmt.Errorf("spool file %s does not start with %q: it is not a spool file, move it out of %s", j.path, fileHeader, s.dir)
	}
	if string(hdr) != fileHeader {
		return fmt.Errorf("spool file %s does not start with %q: it is not a spool file of this version, move it out of %s", j.path, fileHeader, s.dir)
	}
	off := int64(len(fileHeader))
	r := newFileReader(j.f, off, size-off)
	var buf []byte
	var bad error
	for {
		payload, err := readFrame(r, size-off, buf)
		if errors.Is(err, io.EOF) {
			break
		}
		var d *damage
		if errors.As(err, &d) {
			bad = d
			break
		}
		if err != nil {
			return fmt.Errorf("read spool file %s at offset %d: %w", j.path, off, err)
		}
		buf = payload[:0]
		if j.endSeq != 0 {
			bad = &damage{"a frame follows the end record"}
			break
		}
		rec, err := decodeRecord(payload, j.id, j.lastSeq+1)
		if err != nil {
			bad = err
			break
		}
		j.offs = append(j.offs, off)
		j.ats = append(j.ats, rec.At)
		j.lastSeq = rec.Seq
		if rec.Kind == protocol.KindEnd {
			j.endSeq = rec.Seq
		}
		off += frameHeaderLen + int64(len(payload))
	}
	j.size = off
	if bad == nil {
		return nil
	}
	s.log.Warn("cut a damaged tail off a spool file (the RTE or the machine stopped mid-write)",
		zap.String("file", j.path), zap.Int64("offset", off), zap.Int64("dropped_bytes", size-off),
		zap.Int64("kept_records", j.lastSeq), zap.String("reason", bad.Error()))
	if err := j.f.Truncate(off); err != nil {
		return fmt.Errorf("cut damaged tail of spool file %s at offset %d: %w", j.path, off, err)
	}
	if !s.noSync {
		s.syncs.Add(1)
		if err := s.fsync(j.f); err != nil {
			return fmt.Errorf("sync spool file %s: %w", j.path, err)
		}
	}
	return nil
}

// Append assigns job's next seq, writes the record and returns once it is durable. Concurrent
// Appends share fsyncs (see the package doc). data is the kind's JSON object (protocol.StartData,
// OutputData, ...). A record after the job's end record is refused.
//
// On error the record is not in the spool and its seq is not used: the next Append of the job
// gets it. A write or sync failure (a full disk, an I/O error) names the file, and Healthy
// reports it until a later write succeeds.
func (s *Spool) Append(jobID, kind string, data json.RawMessage) (protocol.Record, error) {
	c, err := s.AppendAsync(jobID, kind, data)
	if err != nil {
		return protocol.Record{}, err
	}
	return c.Wait()
}

// Commit is a record written to the spool and waiting for the sync that makes it durable.
type Commit struct {
	s     *Spool
	j     *job
	rec   protocol.Record
	epoch uint64
	b     *batch
	once  sync.Once
	err   error
}

// AppendAsync is Append in two steps, for a writer that must not stall on each sync: it assigns
// the seq and writes the record in order at once, and the Commit's Wait reports when the
// record is durable. A job's producer can keep writing while earlier records are being synced,
// so one sync covers many of its records. The session never sends a record before it is
// durable, whether or not anyone waits. Every Commit must be waited for: Close waits for them.
// When a sync fails, the Waits of every record written since the last durable one fail.
func (s *Spool) AppendAsync(jobID, kind string, data json.RawMessage) (*Commit, error) {
	rec := protocol.Record{Job: jobID, Seq: 1, Kind: kind, Data: data}
	if err := rec.Validate(); err != nil {
		return nil, fmt.Errorf("append to spool: %w", err)
	}
	j, err := s.enterJob(jobID)
	if err != nil {
		return nil, err
	}
	// The syncer waits briefly for appends under way; this one has written once it returns.
	defer func() {
		s.appending.Add(-1)
		s.signal(s.arrived)
	}()
	c, err := s.write(j, rec, kind, jobID)
	if err != nil {
		s.inflight.Done()
		return nil, err
	}
	return c, nil
}

// Wait blocks until the record is durable and returns it, or the error that kept it from
// becoming durable. It may be called more than once.
func (c *Commit) Wait() (protocol.Record, error) {
	c.once.Do(func() {
		defer c.s.inflight.Done()
		<-c.b.done
		c.j.mu.Lock()
		durable := c.j.epoch == c.epoch && c.j.durableSeq >= c.rec.Seq
		syncErr := c.j.syncErr
		c.j.mu.Unlock()
		if !durable {
			if syncErr == nil {
				syncErr = errors.New("the sync did not cover it")
			}
			c.err = fmt.Errorf("append %s record %d to job %s: not durable: %w", c.rec.Kind, c.rec.Seq, c.rec.Job, syncErr)
		}
	})
	if c.err != nil {
		return protocol.Record{}, c.err
	}
	return c.rec, nil
}

// write assigns rec its seq and writes it, under the job's lock.
func (s *Spool) write(j *job, rec protocol.Record, kind, jobID string) (*Commit, error) {

	j.mu.Lock()
	switch {
	case j.removed:
		j.mu.Unlock()
		return nil, fmt.Errorf("append %s record to job %s: the job ended and the app stored its records", kind, jobID)
	case j.endSeq != 0:
		j.mu.Unlock()
		return nil, fmt.Errorf("append %s record to job %s: the job already has its end record (seq %d)", kind, jobID, j.endSeq)
	case j.broken != nil:
		j.mu.Unlock()
		return nil, fmt.Errorf("append %s record to job %s: %w", kind, jobID, j.broken)
	}
	rec.Seq = j.lastSeq + 1
	rec.At = s.now().UTC()
	// Encode checks data is valid JSON, so nothing the app could not decode is spooled.
	payload, err := protocol.Encode(rec)
	if err != nil {
		j.mu.Unlock()
		return nil, fmt.Errorf("append %s record to job %s: data is not valid JSON: %w", kind, jobID, err)
	}
	if len(payload) > maxPayload {
		j.mu.Unlock()
		return nil, fmt.Errorf("append %s record to job %s: the record is %d bytes, more than the %d a message may carry: split it", kind, jobID, len(payload), maxPayload)
	}
	if j.f == nil {
		if err := s.create(j); err != nil {
			j.mu.Unlock()
			s.setHealth(err)
			return nil, err
		}
	}
	frame := appendFrame(make([]byte, 0, frameHeaderLen+len(payload)), payload)
	if _, err := j.f.Write(frame); err != nil {
		err = s.writeFailed(j, err)
		j.mu.Unlock()
		s.setHealth(err)
		return nil, err
	}
	j.offs = append(j.offs, j.size)
	j.ats = append(j.ats, rec.At)
	j.size += int64(len(frame))
	j.lastSeq = rec.Seq
	if kind == protocol.KindEnd {
		j.endSeq = rec.Seq
	}
	epoch := j.epoch
	j.mu.Unlock()
	s.records.Add(1)
	s.bytes.Add(int64(len(frame)))
	return &Commit{s: s, j: j, rec: rec, epoch: epoch, b: s.join(j)}, nil
}

// enterJob registers an Append with Close and finds or makes the job.
func (s *Spool) enterJob(id string) (*job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	j := s.jobs[id]
	if j == nil {
		if _, ok := s.ended[id]; ok {
			return nil, fmt.Errorf("append to job %s: the job ended and the app stored its records; a job id is used once", id)
		}
		j = &job{id: id, path: filepath.Join(s.dir, id+fileExt), base: 1}
		s.jobs[id] = j
	}
	s.inflight.Add(1)
	s.appending.Add(1)
	return j, nil
}

// create makes j's file and writes its header. The directory entry becomes durable in the
// syncer's next pass, before any of the job's records is reported durable.
func (s *Spool) create(j *job) error {
	f, err := os.OpenFile(j.path, os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return s.explain(fmt.Errorf("create spool file: %w", err))
	}
	if _, err := f.Write([]byte(fileHeader)); err != nil {
		f.Close()
		os.Remove(j.path)
		return s.explain(fmt.Errorf("write spool file header: %w", err))
	}
	j.f = f
	j.size = int64(len(fileHeader))
	j.durableSize = j.size
	j.needDirSync = true
	s.bytes.Add(int64(len(fileHeader)))
	return nil
}

// writeFailed cuts a partial frame off j's file so the next record starts on a frame boundary,
// and returns the error for the caller. j.mu is held.
func (s *Spool) writeFailed(j *job, err error) error {
	err = s.explain(fmt.Errorf("append to job %s: %w", j.id, err))
	if terr := j.f.Truncate(j.size); terr != nil {
		j.broken = fmt.Errorf("spool file %s holds a partial record that could not be cut off (%v) after a failed write; restart the RTE to repair it: %w", j.path, terr, err)
		s.log.Error("spool file damaged by a failed write", zap.String("file", j.path), zap.Error(j.broken))
	}
	return err
}

// explain adds what to do to a full-disk error. The wrapped *os.PathError names the file.
func (s *Spool) explain(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("spool %s is full, free space or grow its volume: %w", s.dir, err)
	}
	return err
}

// Ack records that the app stored every record of job up to seq. Once the end record is acked
// the job's file is removed. An ack for an unknown job, or beyond the last durable seq, is
// ignored: the app may ack a job this RTE already dropped.
func (s *Spool) Ack(jobID string, seq int64) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	j := s.jobs[jobID]
	if j == nil {
		s.mu.Unlock()
		return nil
	}
	j.mu.Lock()
	if seq > j.durableSeq {
		last := j.durableSeq
		j.mu.Unlock()
		s.mu.Unlock()
		s.log.Debug("ignoring an ack beyond the last durable record", zap.String("job", jobID), zap.Int64("seq", seq), zap.Int64("last_seq", last))
		return nil
	}
	if seq <= j.acked {
		j.mu.Unlock()
		s.mu.Unlock()
		return nil
	}
	j.acked = seq
	j.trim()
	remove := j.endSeq != 0 && seq >= j.endSeq
	var f *os.File
	if remove {
		j.removed = true
		f, j.f = j.f, nil
		delete(s.jobs, jobID)
		s.remember(jobID)
		s.inflight.Add(1)
	}
	j.mu.Unlock()
	s.mu.Unlock()
	if !remove {
		return nil
	}
	defer s.inflight.Done()
	if f != nil { // normally closed already, when the end became durable
		j.fdMu.Lock()
		f.Close()
		j.fdMu.Unlock()
	}
	// The removal is not synced: if a power loss undoes it, the job comes back ended, its
	// records are resent, and the app, which has them, acks them again.
	if err := os.Remove(j.path); err != nil {
		return fmt.Errorf("remove spool file of acknowledged job %s: %w", jobID, err)
	}
	s.log.Debug("removed the spool file of a job the app stored", zap.String("job", jobID), zap.Int64("last_seq", seq))
	return nil
}

// closeEnded closes the file of a job whose end record is durable: nothing is written to it
// again, and Pending opens its own descriptor, so an RTE holding the records of thousands of
// finished jobs during a long app outage does not hold thousands of descriptors. j.mu is held.
func (j *job) closeEnded() {
	if j.f != nil {
		j.f.Close() // read-only from here on: a close error cannot lose data that was synced
		j.f = nil
	}
}

// trim drops the offsets of acked records. j.mu is held.
func (j *job) trim() {
	n := j.acked - j.base + 1
	if n <= 0 {
		return
	}
	if n > int64(len(j.offs)) {
		n = int64(len(j.offs))
	}
	j.offs = j.offs[n:]
	j.ats = j.ats[n:]
	j.base += n
	// Reslicing keeps the dropped front allocated; copy once most of it is dead so a long job
	// that is acked as it goes does not hold every offset it ever had.
	if cap(j.offs) > 1024 && len(j.offs) < cap(j.offs)/4 {
		j.offs = append(make([]int64, 0, 2*len(j.offs)), j.offs...)
		j.ats = append(make([]time.Time, 0, 2*len(j.ats)), j.ats...)
	}
}

// remember notes a removed job so a late Append is refused. s.mu is held.
func (s *Spool) remember(id string) {
	if len(s.endedRing) >= endedMemory {
		delete(s.ended, s.endedRing[0])
		s.endedRing = s.endedRing[1:]
	}
	s.ended[id] = struct{}{}
	s.endedRing = append(s.endedRing, id)
}

// Pending calls fn, in seq order, for each durable record of job with seq above both after and
// the acked seq, with the record and its frame (the protocol.Encode bytes, ready to send).
// Records come from disk. fn may keep rec and frame; it runs without any spool lock held, so it
// may block (on a socket, say) without stalling Append. An error from fn stops the walk and is
// returned as is. Records that become durable during the walk are not included: the next
// signal on Changed tells of them. An unknown job has nothing pending.
func (s *Spool) Pending(jobID string, after int64, fn func(rec protocol.Record, frame []byte) error) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	j := s.jobs[jobID]
	s.mu.Unlock()
	if j == nil {
		return nil
	}
	j.mu.Lock()
	from := max(after, j.acked, 0) + 1
	to := j.durableSeq
	if from > to || j.removed {
		j.mu.Unlock()
		return nil
	}
	start := j.offs[from-j.base]
	end := j.durableSize
	j.mu.Unlock()

	// A descriptor of its own: Ack may close the job's writer mid-walk, and a removed file
	// stays readable through a descriptor opened before.
	f, err := os.Open(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // acked and removed since the snapshot
	}
	if err != nil {
		return fmt.Errorf("open spool file: %w", err)
	}
	defer f.Close()
	r := newFileReader(f, start, end-start)
	off := start
	for seq := from; seq <= to; seq++ {
		payload, err := readFrame(r, end-off, nil)
		if err != nil {
			return fmt.Errorf("read record %d of job %s from spool file %s at offset %d: %w", seq, jobID, j.path, off, err)
		}
		rec, err := envelope(payload, jobID, seq)
		if err != nil {
			return fmt.Errorf("read record %d of job %s from spool file %s at offset %d: %w", seq, jobID, j.path, off, err)
		}
		off += frameHeaderLen + int64(len(payload))
		if err := fn(rec, payload); err != nil {
			return err
		}
	}
	return nil
}

// Jobs lists every job with a durable record, sorted by job id.
func (s *Spool) Jobs() []JobState {
	s.mu.Lock()
	out := make([]JobState, 0, len(s.jobs))
	for _, j := range s.jobs {
		j.mu.Lock()
		if j.durableSeq > 0 {
			st := JobState{Job: j.id, LastSeq: j.durableSeq, Acked: j.acked, Ended: j.endSeq != 0 && j.endSeq <= j.durableSeq}
			if i := j.acked + 1 - j.base; j.acked < j.durableSeq && i >= 0 && i < int64(len(j.offs)) {
				st.WaitingBytes = j.durableSize - j.offs[i]
				st.OldestWaiting = j.ats[i]
			}
			out = append(out, st)
		}
		j.mu.Unlock()
	}
	s.mu.Unlock()
	sort.Slice(out, func(a, b int) bool { return out[a].Job < out[b].Job })
	return out
}

// Progress is Jobs as hello's spooled list: each job with its highest durable seq, sorted by
// job id.
func (s *Spool) Progress() []protocol.SpooledJob {
	jobs := s.Jobs()
	out := make([]protocol.SpooledJob, len(jobs))
	for i, j := range jobs {
		out[i] = protocol.SpooledJob{Job: j.Job, LastSeq: j.LastSeq}
	}
	return out
}

// Has reports whether the spool holds records of job, durable or being made so. It turns false
// once the job's end is acked and its file removed.
func (s *Spool) Has(jobID string) bool {
	s.mu.Lock()
	j := s.jobs[jobID]
	s.mu.Unlock()
	if j == nil {
		return false
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.lastSeq > 0 && !j.removed
}

// Changed is signalled after records become durable. Signals coalesce (the channel holds one),
// so a receiver that wakes must send everything pending, not one record. Meant for one
// receiver, the session.
func (s *Spool) Changed() <-chan struct{} { return s.changed }

// Defaults of Options.
const (
	defaultRetryEvery = 5 * time.Second
	// probeBytes is the size of Healthy's test write: one full output record, so "healthy"
	// means the next batch of output fits.
	probeBytes = 64<<10 + 512
	probeName  = "probe.tmp"
)

// Healthy returns nil, or the last write or sync error while the spool cannot be written. While
// it reports an error it tries a test write of one record's size (a file probe.tmp, removed at
// once) every Options.RetryEvery at most, starting RetryEvery after the error, and turns healthy when that succeeds, so the spool
// heals once space is freed even if nothing is appended. The test write blocks the caller for
// the write and a sync.
func (s *Spool) Healthy() error {
	s.healthMu.Lock()
	err := s.health
	due := err != nil && time.Since(s.lastProbe) >= s.retryEvery
	if due {
		s.lastProbe = time.Now()
	}
	s.healthMu.Unlock()
	if !due {
		return err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return err
	}
	err = s.probe()
	s.setHealth(err)
	return err
}

// probe writes and syncs a file of one record's size, and removes it.
func (s *Spool) probe() error {
	path := filepath.Join(s.dir, probeName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return s.explain(fmt.Errorf("test write to spool: %w", err))
	}
	_, err = f.Write(make([]byte, probeBytes))
	if err == nil && !s.noSync {
		s.syncs.Add(1)
		err = s.fsync(f)
	}
	f.Close()
	os.Remove(path)
	if err != nil {
		return s.explain(fmt.Errorf("test write to spool: %w", err))
	}
	return nil
}

func (s *Spool) setHealth(err error) {
	s.healthMu.Lock()
	prev := s.health
	s.health = err
	if err != nil && prev == nil {
		s.lastProbe = time.Now() // report a new error for a while before a test write may clear it
	}
	s.healthMu.Unlock()
	switch {
	case err != nil && prev == nil:
		s.log.Error("spool cannot be written", zap.String("dir", s.dir), zap.Error(err))
	case err == nil && prev != nil:
		s.log.Info("spool can be written again", zap.String("dir", s.dir))
	}
}

// Stats returns counters since Open.
func (s *Spool) Stats() Stats {
	return Stats{Records: s.records.Load(), Bytes: s.bytes.Load(), Syncs: s.syncs.Load(), Commits: s.commits.Load()}
}

// Close waits for Appends and Acks in progress, stops the syncer, closes every file and
// releases the directory. A Pending walk in progress keeps its own descriptor and may finish.
// Calls after Close return ErrClosed; a second Close returns nil.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
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
