package spool

import (
	"os"
	"sync"
	"time"
)

// job is one job file and its index. Record bodies stay on disk; memory per job is the offsets
// of its unacknowledged records.
type job struct {
	id   string
	path string

	mu      sync.Mutex // guards every field below but fdMu; taken after jobTable.mu
	f       *os.File   // nil until the first Append creates the file, and again once the end is durable
	size    int64      // bytes written, durable or not
	lastSeq int64      // last seq written
	endSeq  int64      // seq of the end record, 0 before it is written
	index
	durableSeq  int64
	durableSize int64
	acked       int64
	needDirSync bool   // the file's directory entry is not yet durable
	epoch       uint64 // bumped when unsynced records are cut after a failed sync
	syncErr     error  // why the last cut happened
	broken      error  // a failed write or sync left bytes that could not be cut off; no more appends
	removed     bool

	// fdMu keeps Ack from closing the file while the syncer fsyncs it. Taken after mu.
	fdMu sync.Mutex
}

// index finds a job's unacknowledged records in its file. It is guarded by the job's mu.
type index struct {
	// base is the seq of offs[0]; offs[i] is the file offset of record base+i. Acked records
	// are dropped from the front.
	base int64
	offs []int64
	// ats[i] is the time of record base+i (its At), for the age of the oldest unacked record.
	ats []time.Time
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

// trim drops the offsets of records up to acked. The job's mu is held.
func (j *index) trim(acked int64) {
	n := acked - j.base + 1
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
