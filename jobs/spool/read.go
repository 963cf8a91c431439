package spool

import (
	"errors"
	"fmt"
	"os"
	"sort"

	"github.com/rte-project/rte/protocol"
)

// Pending calls fn, in seq order, for each durable record of job with seq above both after and
// the acked seq, with the record and its frame (the protocol.Encode bytes, ready to send).
// Records come from disk. fn may keep rec and frame; it runs without any spool lock held, so it
// may block (on a socket, say) without stalling Append. An error from fn stops the walk and is
// returned as is. Records that become durable during the walk are not included: the next
// signal on Changed tells of them. An unknown job has nothing pending.
func (s *Spool) Pending(jobID string, after int64, fn func(rec protocol.Record, frame []byte) error) error {
	s.jobTable.mu.Lock()
	if s.closed {
		s.jobTable.mu.Unlock()
		return ErrClosed
	}
	j := s.jobs[jobID]
	s.jobTable.mu.Unlock()
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
	s.jobTable.mu.Lock()
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
	s.jobTable.mu.Unlock()
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
	s.jobTable.mu.Lock()
	j := s.jobs[jobID]
	s.jobTable.mu.Unlock()
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
