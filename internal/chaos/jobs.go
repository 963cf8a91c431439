package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rte-project/rte/internal/refapp/api"
)

// jobSpec is what a job was asked to print: lines numbered 1..Lines in Batches batches,
// Pause seconds apart. Lines is a multiple of Batches, so the playbook prints exactly Lines.
type jobSpec struct {
	Lines   int `json:"lines"`
	Batches int `json:"batches"`
	Pause   int `json:"pause"`
}

// driver keeps cfg.Jobs jobs in flight, submitted through the admin API of a live node, each
// to a runner and with a size drawn from its own seeded source.
type driver struct {
	c   *cluster
	rng *rand.Rand

	mu       sync.Mutex
	failures int // submits that failed (the node went down mid-call, say); the next tick tries again
}

func newDriver(c *cluster, seed uint64) *driver {
	return &driver{c: c, rng: rand.New(rand.NewPCG(seed, 0x6a6f6273))}
}

// draw picks the next job: a runner and a size. Short jobs end between faults; long ones
// (up to 12 batches 3 s apart) are hit mid-run, and cost little CPU while they pause.
func (d *driver) draw() (string, jobSpec) {
	runner := d.c.rtes[d.rng.IntN(len(d.c.rtes))].name
	batches := 2 + d.rng.IntN(11)
	per := 50 * (1 + d.rng.IntN(40))
	return runner, jobSpec{Lines: per * batches, Batches: batches, Pause: 1 + d.rng.IntN(3)}
}

// run submits jobs until ctx ends, keeping the number not yet ended at cfg.Jobs.
func (d *driver) run(ctx context.Context) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		open, err := d.open(ctx)
		if err != nil {
			continue
		}
		for ; open < d.c.cfg.Jobs && ctx.Err() == nil; open++ {
			runner, spec := d.draw()
			if err := d.submit(ctx, runner, spec); err != nil {
				d.mu.Lock()
				d.failures++
				d.mu.Unlock()
				break
			}
		}
	}
}

// open counts the jobs not yet ended.
func (d *driver) open(ctx context.Context) (int, error) {
	cl, err := d.c.client(ctx, 0)
	if err != nil {
		return 0, err
	}
	jobs, err := cl.Jobs(ctx, "", "queued,dispatched,running", 1000)
	return len(jobs), err
}

func (d *driver) submit(ctx context.Context, runner string, spec jobSpec) error {
	vars, _ := json.Marshal(spec)
	cl, err := d.c.client(ctx, d.rng.IntN(len(d.c.nodes)))
	if err != nil {
		return err
	}
	// The store keeps the extravars, so the check reads each job's spec from there.
	_, err = cl.Submit(ctx, api.JobRequest{Runner: runner, JobOptions: api.JobOptions{
		Playbook: "lines.yml", Inventories: []string{"local.ini"}, Extravars: vars, TimeoutS: 900,
	}})
	return err
}

// jobsOf is the ids of the runner's jobs not yet ended, as a live node sees them.
func (c *cluster) jobsOf(ctx context.Context, runner, states string) ([]api.JobView, error) {
	cl, err := c.client(ctx, 0)
	if err != nil {
		return nil, err
	}
	return cl.Jobs(ctx, runner, states, 1000)
}

// waitEnded waits until no job is queued, dispatched or running, or within has passed.
func (c *cluster) waitEnded(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	var open []api.JobView
	for time.Now().Before(deadline) {
		var err error
		open, err = c.jobsOf(ctx, "", "queued,dispatched,running")
		if err == nil && len(open) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	ids := make([]string, 0, len(open))
	for _, j := range open {
		ids = append(ids, j.ID+" ("+j.State+" on "+j.Runner+")")
	}
	return fmt.Errorf("%d jobs had not ended %s after the last fault: %v", len(open), within, ids)
}
