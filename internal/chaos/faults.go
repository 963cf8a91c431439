package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rte-project/rte/internal/testenv"
)

// fault is one entry of the schedule, drawn from the seed before the run starts, and what
// happened when it was injected.
type fault struct {
	N    int
	Kind Kind
	RTE  int           // index of the target RTE (for node-kill: whose socket's holder dies)
	Gap  time.Duration // pause after the previous injection
	Hold time.Duration // how long the fault lasts: the restart delay, the stall, the full spool
	Seed uint64        // the bundle-cut's ballast bytes

	Start, End time.Time     // injection, and the moment the fault was lifted
	Recovered  time.Duration // from Start; 0 when it did not recover
	MidJob     bool          // a job of the RTE was running with records stored when it was injected
	Missed     bool          // a bundle-cut that found no transfer to cut, so it broke nothing
	Note       string
	Failure    string // the invariant this fault broke; "" when none

	// proc and mark are the RTE process and its log's length at the injection: a welcome
	// logged after them is a handshake newer than the fault.
	proc *testenv.RTE
	mark int
}

// ballastBytes is the size of the file a bundle-cut adds to the playbooks, so that the next
// bundle is large; cutAfter is how far into it the socket is cut.
const (
	ballastBytes = 16 << 20
	cutAfter     = 5 << 20
	midJobWait   = 5 * time.Second
	bundleWait   = 60 * time.Second
)

// schedule draws the faults: kind, target, the pause before each, and how long each lasts.
// The first len(cfg.Kinds) faults are the kinds in a drawn order, so that a run of that many
// faults or more injects every kind; the rest are drawn one by one.
func schedule(rng *rand.Rand, cfg *Config) []*fault {
	out := make([]*fault, cfg.Faults)
	first := slices.Clone(cfg.Kinds)
	rng.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	for i := range out {
		kind := cfg.Kinds[rng.IntN(len(cfg.Kinds))]
		if i < len(first) {
			kind = first[i]
		}
		f := &fault{N: i + 1, Kind: kind, RTE: rng.IntN(cfg.RTEs),
			Gap: time.Duration((0.2 + 1.6*rng.Float64()) * float64(cfg.Gap)), Seed: rng.Uint64()}
		switch f.Kind {
		case RTEKill, RTETerm, NodeKill:
			f.Hold = time.Duration(300+rng.IntN(2700)) * time.Millisecond
		case Stall:
			f.Hold = rteDeadAfter + time.Duration(1000+rng.IntN(2000))*time.Millisecond
		case SpoolFull:
			f.Hold = time.Duration(2000+rng.IntN(4000)) * time.Millisecond
		}
		out[i] = f
	}
	return out
}

func (f *fault) String() string {
	s := fmt.Sprintf("fault %d %s on rte-%d", f.N, f.Kind, f.RTE+1)
	if f.Hold > 0 {
		s += fmt.Sprintf(" for %s", f.Hold.Round(10*time.Millisecond))
	}
	return s
}

// inject runs the schedule: each fault is handed to its RTE's lane after its gap; a lane runs
// its faults one after another, each once the previous one has recovered (node-kill and
// bundle-cut also one at a time across lanes), so faults on different RTEs overlap while the
// injections keep the schedule's pace.
func (h *harness) inject(ctx context.Context) {
	lanes := make([]chan *fault, len(h.c.rtes))
	var running sync.WaitGroup
	for i := range lanes {
		lanes[i] = make(chan *fault, len(h.faults))
		running.Add(1)
		go func() {
			defer running.Done()
			for f := range lanes[i] {
				if ctx.Err() != nil {
					continue
				}
				global := h.globalLock(f.Kind)
				if global != nil {
					global.Lock()
				}
				h.run(ctx, f, h.c.rtes[i])
				if global != nil {
					global.Unlock()
				}
			}
		}()
	}
	for _, f := range h.faults {
		select {
		case <-ctx.Done():
		case <-time.After(f.Gap):
		}
		lanes[f.RTE] <- f
	}
	for _, l := range lanes {
		close(l)
	}
	running.Wait()
}

// run injects one fault, lifts it, and waits for the recovery.
func (h *harness) run(ctx context.Context, f *fault, r *rteBox) {
	if f.Kind != BundleCut {
		f.Note, f.MidJob = h.midJob(ctx, r)
	}
	f.proc = r.current()
	f.mark = f.proc.Mark()
	f.Start = time.Now()
	h.say("+%6.1fs %s: inject", h.since(f.Start), f)
	if err := h.apply(ctx, f, r); err != nil {
		f.Failure = err.Error()
		h.say("+%6.1fs %s: FAILED: %v", h.since(time.Now()), f, err)
		return
	}
	f.End = time.Now()
	h.recover(ctx, f, r)
	if f.Failure != "" {
		h.say("+%6.1fs %s: FAILED: %s", h.since(time.Now()), f, f.Failure)
		return
	}
	note := ""
	if f.Note != "" {
		note = " (" + f.Note + ")"
	}
	h.say("+%6.1fs %s: recovered %.2fs after injection%s", h.since(time.Now()), f, f.Recovered.Seconds(), note)
}

// apply injects the fault and lifts it; an error is an invariant failure (a process that died
// when it should not have, or would not restart).
func (h *harness) apply(ctx context.Context, f *fault, r *rteBox) error {
	switch f.Kind {
	case RTEKill, RTETerm:
		p := r.current()
		sig := syscall.SIGKILL
		if f.Kind == RTETerm {
			sig = syscall.SIGTERM
		}
		r.expectExit()
		p.Signal(sig)
		select {
		case <-p.Done():
		case <-time.After(time.Minute):
			p.Kill()
			return fmt.Errorf("%s did not exit within a minute of %s", r.name, sig)
		}
		if f.Kind == RTETerm && p.Err() != nil {
			return fmt.Errorf("%s exited with %v after SIGTERM, want status 0 after a drain", r.name, p.Err())
		}
		sleep(ctx, f.Hold)
		return h.c.startRTE(ctx, r)
	case RTEHup:
		p := r.current()
		p.Signal(syscall.SIGHUP)
		select {
		case <-p.Done():
			return fmt.Errorf("%s exited on SIGHUP (%v); it must log it and go on", r.name, p.Err())
		case <-time.After(time.Second):
			return nil
		}
	case NodeKill:
		return h.killNode(ctx, f, r)
	case Cut:
		n := r.fwd.Drop()
		f.Note = joinNote(f.Note, fmt.Sprintf("%d connections cut", n))
		return nil
	case Stall:
		r.fwd.Stall(true)
		sleep(ctx, f.Hold)
		r.fwd.Stall(false)
		return nil
	case SpoolFull:
		filler := filepath.Join(r.spool, "chaos-filler")
		n, err := fill(filler)
		if err != nil {
			os.Remove(filler)
			return fmt.Errorf("fill %s: %w", r.spool, err)
		}
		f.Note = joinNote(f.Note, fmt.Sprintf("%d MiB filler", n>>20))
		sleep(ctx, f.Hold)
		return os.Remove(filler)
	case BundleCut:
		return h.cutBundle(ctx, f, r)
	}
	return fmt.Errorf("unknown fault kind %q", f.Kind)
}

// midJob waits (a while at most) until the RTE runs a job that has stored records beyond its
// start, so that the fault lands mid-job; it names the job.
func (h *harness) midJob(ctx context.Context, r *rteBox) (string, bool) {
	var id string
	testenv.Poll(midJobWait, func() bool {
		jobs, err := h.c.jobsOf(ctx, r.name, "running")
		if err != nil {
			return false
		}
		for _, j := range jobs {
			if j.LastSeq >= 2 {
				id = j.ID
				return true
			}
		}
		return false
	})
	if id == "" {
		return "no job running", false
	}
	return "job " + id + " running", true
}

// killNode kills the app node holding the runner's socket and starts it again after Hold.
func (h *harness) killNode(ctx context.Context, f *fault, r *rteBox) error {
	v, _ := h.c.runner(ctx, r.name)
	n := h.c.node(v.Node)
	if n == nil || !n.alive() {
		n = h.c.nodes[0]
		f.Note = joinNote(f.Note, "no live node held the socket; killed "+n.name)
	} else {
		f.Note = joinNote(f.Note, n.name+" held the socket")
	}
	n.expectExit()
	n.current().Kill()
	sleep(ctx, f.Hold)
	return h.c.startNode(ctx, n)
}

// cutBundle makes the playbooks' bundle large and new, and cuts the runner's socket once part
// of it has passed.
func (h *harness) cutBundle(ctx context.Context, f *fault, r *rteBox) error {
	ballast := make([]byte, ballastBytes)
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], f.Seed)
	_, _ = rand.NewChaCha8(seed).Read(ballast)
	cut := r.fwd.DropAfter(cutAfter)
	if err := os.WriteFile(filepath.Join(h.c.playbooks, "ballast.bin"), ballast, 0o600); err != nil {
		return err
	}
	select {
	case <-cut:
		// The fault is the cut, not the wait for a transfer: recovery counts from here.
		f.proc, f.Start = r.current(), time.Now()
		f.mark = f.proc.Mark()
		f.Note = joinNote(f.Note, fmt.Sprintf("cut %d MiB into the transfer of a %d MiB bundle", cutAfter>>20, ballastBytes>>20))
	case <-time.After(bundleWait):
		r.fwd.DropAfter(1 << 62) // disarm
		// Nothing happened, so nothing is to recover from: the wait is not recovery time.
		f.proc, f.Start = r.current(), time.Now()
		f.mark = f.proc.Mark()
		f.Missed = true
		f.Note = joinNote(f.Note, "no bundle went to this RTE within "+bundleWait.String()+"; nothing cut")
	case <-ctx.Done():
	}
	return nil
}

// recover waits until the runner is connected again (after a handshake newer than the fault
// when the fault broke the socket), its RTE is ready (after spool-full), and every record the
// RTE's spool held when the fault was lifted is stored.
func (h *harness) recover(ctx context.Context, f *fault, r *rteBox) {
	targets, err := spoolHighWater(r.spool)
	if err != nil {
		f.Failure = fmt.Sprintf("read the spool of %s: %v", r.name, err)
		return
	}
	deadline := f.Start.Add(h.cfg.Recovery)
	var why string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		why = h.recovered(ctx, f, r, targets)
		if why == "" {
			f.Recovered = time.Since(f.Start)
			return
		}
		sleep(ctx, 100*time.Millisecond)
	}
	f.Failure = fmt.Sprintf("not recovered %s after injection: %s", h.cfg.Recovery, why)
}

// recovered returns "" once the fault has recovered, else what is still missing.
func (h *harness) recovered(ctx context.Context, f *fault, r *rteBox, targets map[string]int64) string {
	v, ok := h.c.runner(ctx, r.name)
	if !ok || !v.Connected {
		return "the runner is not connected"
	}
	p := r.current()
	if f.Kind.breaksSocket() && !f.Missed {
		from := 0
		if p == f.proc {
			from = f.mark
		}
		if !slices.ContainsFunc(p.Lines(from), func(l map[string]any) bool { return l["msg"] == "welcomed" }) {
			return "the RTE was not welcomed again"
		}
	}
	if f.Kind == SpoolFull && get(ctx, "https://"+r.addr()+"/ready") != 200 {
		return "the RTE's /ready does not answer 200"
	}
	cl, err := h.c.client(ctx, 0)
	if err != nil {
		return err.Error()
	}
	for job, seq := range targets {
		j, err := cl.Job(ctx, job)
		if err != nil {
			return fmt.Sprintf("job %s: %v", job, err)
		}
		if j.LastSeq < seq {
			return fmt.Sprintf("job %s: stored up to seq %d, the spool held %d", job, j.LastSeq, seq)
		}
	}
	return ""
}

func (h *harness) globalLock(k Kind) interface {
	Lock()
	Unlock()
} {
	switch k {
	case NodeKill:
		return &h.nodeLane
	case BundleCut:
		return &h.bundleLane
	}
	return nil
}

// fill writes zeros to path until the file system is full, and returns how many bytes fit.
func fill(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var total int64
	for _, size := range []int{1 << 20, 4 << 10, 512} {
		buf := make([]byte, size)
		for {
			n, err := f.Write(buf)
			total += int64(n)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

func joinNote(a, b string) string {
	return strings.TrimPrefix(a+"; "+b, "; ")
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
