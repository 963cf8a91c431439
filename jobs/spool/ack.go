package spool

import (
	"fmt"
	"os"

	"go.uber.org/zap"
)

// Ack records that the app stored every record of job up to seq. Once the end record is acked
// the job's file is removed. An ack for an unknown job, or beyond the last durable seq, is
// ignored: the app may ack a job this RTE already dropped.
func (s *Spool) Ack(jobID string, seq int64) error {
	s.jobTable.mu.Lock()
	if s.closed {
		s.jobTable.mu.Unlock()
		return ErrClosed
	}
	j := s.jobs[jobID]
	if j == nil {
		s.jobTable.mu.Unlock()
		return nil
	}
	j.mu.Lock()
	if seq > j.durableSeq {
		last := j.durableSeq
		j.mu.Unlock()
		s.jobTable.mu.Unlock()
		s.log.Debug("ignoring an ack beyond the last durable record", zap.String("job", jobID), zap.Int64("seq", seq), zap.Int64("last_seq", last))
		return nil
	}
	if seq <= j.acked {
		j.mu.Unlock()
		s.jobTable.mu.Unlock()
		return nil
	}
	j.acked = seq
	j.trim(j.acked)
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
	s.jobTable.mu.Unlock()
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

// endedMemory is how many removed job ids are remembered to refuse a late Append. A late
// append comes right after the end, so a short memory is enough, and it stays bounded on an
// RTE that runs for months.
const endedMemory = 1024

// remember notes a removed job so a late Append is refused. s.jobTable.mu is held.
func (s *Spool) remember(id string) {
	if len(s.endedRing) >= endedMemory {
		delete(s.ended, s.endedRing[0])
		s.endedRing = s.endedRing[1:]
	}
	s.ended[id] = struct{}{}
	s.endedRing = append(s.endedRing, id)
}
