package session_test

import (
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/rte-project/rte/protocol"
)

// fakeOutbox is an in-memory spool: records per job, a cumulative ack per job, and every Ack
// call kept for the test to see.
type fakeOutbox struct {
	mu      sync.Mutex
	records map[string][]protocol.Record
	acked   map[string]int64
	acks    chan protocol.Ack
	changed chan struct{}
}

func newOutbox() *fakeOutbox {
	return &fakeOutbox{
		records: map[string][]protocol.Record{},
		acked:   map[string]int64{},
		acks:    make(chan protocol.Ack, 100),
		changed: make(chan struct{}, 1),
	}
}

// add appends the next record of job and signals Changed, as a durable append would.
func (o *fakeOutbox) add(job, text string) protocol.Record {
	o.mu.Lock()
	data, _ := json.Marshal(protocol.OutputData{Text: text})
	rec := protocol.Record{Job: job, Seq: int64(len(o.records[job]) + 1), Kind: protocol.KindOutput,
		At: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC), Data: data}
	o.records[job] = append(o.records[job], rec)
	o.mu.Unlock()
	select {
	case o.changed <- struct{}{}:
	default:
	}
	return rec
}

func (o *fakeOutbox) Progress() []protocol.SpooledJob {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []protocol.SpooledJob
	for job, recs := range o.records {
		out = append(out, protocol.SpooledJob{Job: job, LastSeq: recs[len(recs)-1].Seq})
	}
	slices.SortFunc(out, func(a, b protocol.SpooledJob) int {
		switch {
		case a.Job < b.Job:
			return -1
		case a.Job > b.Job:
			return 1
		}
		return 0
	})
	return out
}

func (o *fakeOutbox) Pending(job string, after int64, fn func(protocol.Record, []byte) error) error {
	o.mu.Lock()
	var todo []protocol.Record
	for _, r := range o.records[job] {
		if r.Seq > after && r.Seq > o.acked[job] {
			todo = append(todo, r)
		}
	}
	o.mu.Unlock()
	for _, r := range todo {
		frame, err := protocol.Encode(&r)
		if err != nil {
			return err
		}
		if err := fn(r, frame); err != nil {
			return err
		}
	}
	return nil
}

func (o *fakeOutbox) Ack(job string, seq int64) error {
	o.mu.Lock()
	if _, ok := o.records[job]; !ok {
		o.mu.Unlock()
		return errors.New("no such job in the spool")
	}
	if seq > o.acked[job] {
		o.acked[job] = seq
	}
	o.mu.Unlock()
	o.acks <- protocol.Ack{Job: job, Seq: seq}
	return nil
}

func (o *fakeOutbox) Changed() <-chan struct{} { return o.changed }

// refusal is an error from Jobs.Start that carries a job.refused code.
type refusal struct{ code, msg string }

func (r refusal) Error() string       { return r.msg }
func (r refusal) RefusalCode() string { return r.code }

// fakeJobs records what the session asks of it.
type fakeJobs struct {
	mu       sync.Mutex
	startErr error
	started  []string
	max      int // the limit in force
	def      int // the limit when the app sets none (RTE_MAX_JOBS)
	running  []string
	canceled chan string
	maxSet   chan int
	changed  chan struct{}
}

func newJobs(max int, running ...string) *fakeJobs {
	return &fakeJobs{max: max, def: max, running: running, canceled: make(chan string, 10),
		maxSet: make(chan int, 10), changed: make(chan struct{}, 1)}
}

func (j *fakeJobs) Start(js *protocol.JobStart) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.startErr != nil {
		return j.startErr
	}
	j.started = append(j.started, js.Job)
	return nil
}

func (j *fakeJobs) setStartErr(err error) {
	j.mu.Lock()
	j.startErr = err
	j.mu.Unlock()
}

func (j *fakeJobs) Cancel(job string) bool {
	j.canceled <- job
	return job == "known"
}

// SetMaxJobs follows jobs.Manager's rule, 0 restores the RTE's own limit, and reports the
// limit in force afterwards on maxSet.
func (j *fakeJobs) SetMaxJobs(n int) {
	if n == 0 {
		n = j.def
	}
	j.mu.Lock()
	j.max = n
	j.mu.Unlock()
	j.maxSet <- n
}

func (j *fakeJobs) DefaultMaxJobs() int { return j.def }

func (j *fakeJobs) Capacity() protocol.Capacity {
	j.mu.Lock()
	defer j.mu.Unlock()
	return protocol.Capacity{Running: len(j.running), MaxJobs: j.max}
}

func (j *fakeJobs) Running() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.running)
}

func (j *fakeJobs) Changed() <-chan struct{} { return j.changed }

// setRunning changes the running jobs and signals Changed.
func (j *fakeJobs) setRunning(running ...string) {
	j.mu.Lock()
	j.running = running
	j.mu.Unlock()
	select {
	case j.changed <- struct{}{}:
	default:
	}
}
