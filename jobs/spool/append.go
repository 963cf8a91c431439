package spool

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/rte-project/rte/protocol"
	"go.uber.org/zap"
)

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
	s.jobTable.mu.Lock()
	defer s.jobTable.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	j := s.jobs[id]
	if j == nil {
		if _, ok := s.ended[id]; ok {
			return nil, fmt.Errorf("append to job %s: the job ended and the app stored its records; a job id is used once", id)
		}
		j = &job{id: id, path: filepath.Join(s.dir, id+fileExt), index: index{base: 1}}
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
