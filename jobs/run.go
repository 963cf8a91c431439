package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/jobs/afevents"
	"github.com/rte-project/rte/protocol"
)

const (
	// maxEventBytes bounds one event line: the plugin never writes a longer one, so a longer
	// line is a broken plugin, and it is dropped rather than held in memory.
	maxEventBytes = afevents.MaxLineBytes

	// pipeCloseWait is how long the output pipes may stay open after ansible-playbook exited
	// and its process group was killed: only a process that left the group (a daemon started
	// with setsid) still holds them then, and the job does not wait for it.
	pipeCloseWait = 2 * time.Second

	// maxLogMessage bounds a log record's message.
	maxLogMessage = 2000
)

// runner is one job's run, owned by the job's goroutine: only that goroutine appends records,
// so they are in order. Its parts: the job's directory and files (here), the process group
// (group.go), the output and event batches (batch.go), the records handed to the Recorder
// (record.go) and the end decided from how the process ended (end.go). None is shared with
// another goroutine, so none has a lock.
type runner struct {
	m   *Manager
	j   *job
	cfg *Config
	log *zap.Logger
	dir string
	// made is true once dir exists and is this job's: it is removed at the end.
	made    bool
	ws      Workspace
	secrets *secretSet
	notes   []protocol.LogData // said before the start record, appended right after it

	recording
	outputBatch
	eventBatch
	flushTimer
}

func newRunner(m *Manager, j *job) *runner {
	values := make([]string, 0, len(j.secrets))
	for _, v := range j.secrets {
		values = append(values, v)
	}
	s := newSecretSet(values)
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &runner{
		m:           m,
		j:           j,
		cfg:         &m.cfg,
		log:         m.log.With(zap.String("job", j.id)),
		dir:         filepath.Join(m.cfg.WorkDir, j.id),
		secrets:     s,
		outputBatch: outputBatch{mask: newMasker(s.output)},
		eventBatch:  eventBatch{evNext: make([]int, len(s.events))},
		flushTimer:  flushTimer{flush: t},
	}
}

// execute runs the job to its end and records the end.
func (r *runner) execute() {
	end := r.run()
	r.cleanup()
	// Written down before the end record, which the app may store and acknowledge at once:
	// from then on a replayed start finds the id ran, never a moment where it is neither
	// spooled nor remembered.
	if err := r.m.ran.add(r.j.id); err != nil {
		r.log.Error("could not write down that the job ran; a replayed job.start for it is refused only until the RTE restarts", zap.Error(err))
	}
	r.j.ended.Store(true)
	r.appendEnd(end)
}

// run prepares and runs the job; it returns the end to record.
func (r *runner) run() protocol.EndData {
	// Start refused such an id already; checked again here because this is where a directory
	// is made and removed, and r.made stays false, so cleanup removes nothing.
	if _, err := jobDir(r.cfg.WorkDir, r.j.id); err != nil {
		return errorEnd("%v", err)
	}
	// A directory left by an RTE that stopped mid-job is stale: the job is new to the Recorder.
	// Removed like the unpacked bundles it may hold: a playbook can leave directories
	// read-only, which os.RemoveAll alone cannot remove.
	if err := bundle.RemoveTree(r.dir); err != nil {
		return errorEnd("remove stale job directory %s: %v", r.dir, err)
	}
	if err := os.Mkdir(r.dir, 0o700); err != nil {
		return errorEnd("make job directory %s: %v (check WorkDir's permissions and free space)", r.dir, err)
	}
	r.made = true

	ws, err := r.cfg.Files.Prepare(r.j.ctx, r.j.js, r.dir)
	if err != nil {
		if end, ok := r.stoppedBeforeStart(); ok {
			return end
		}
		return errorEnd("prepare files: %v", err)
	}
	r.ws = ws
	if end, ok := r.stoppedBeforeStart(); ok {
		return end
	}
	secretDir := r.m.engine.secretDir()
	priv, err := writePrivate(r.dir, r.j.js, r.j.secrets, secretDir)
	if err != nil {
		return errorEnd("write job files: %v", err)
	}
	where := "a 0600 file of the job directory"
	if secretDir != "" {
		where = "a file on the container's tmpfs " + secretDir + ", never on the RTE's disk"
	}
	for _, name := range sortedKeys(priv.secrets) {
		r.notes = append(r.notes, protocol.LogData{Level: protocol.LevelInfo, Message: fmt.Sprintf(
			"%s given to ansible-playbook in %s (%s); its value is masked in output and events",
			name, where, secretOptions[name])})
	}

	pluginDir, err := r.m.engine.pluginDir(priv)
	if err != nil {
		return errorEnd("%v", err)
	}
	g, outR, evR, err := r.m.engine.start(r.j.ctx, launch{
		job:    r.j.id,
		jobDir: r.dir,
		priv:   priv,
		image:  r.j.js.Image,
		binary: r.m.binary,
		args:   buildArgs(r.j.js, ws, priv),
		env:    append(buildEnv(r.cfg.BaseEnv, r.j.js.Env, pluginEnv(pluginDir), priv.tmp), JobIDEnv+"="+r.j.id),
		dir:    ws.Dir,
	})
	if err != nil {
		// An engine that talks to a daemon gives up when the job is stopped mid-start (a
		// cancel while the image is pulled): that is the stop's end, not an error.
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			if end, ok := r.stoppedBeforeStart(); ok {
				return end
			}
		}
		return errorEnd("%v", err)
	}
	r.log.Info("ansible-playbook started", zap.Int("pid", g.pid()), zap.String("engine", g.what()))
	return r.supervise(g, outR, evR)
}

// image is the job image the job's container runs, "" for a process group.
func (r *runner) image() string {
	switch {
	case r.cfg.Containers == nil:
		return ""
	case r.j.js.Image != "":
		return r.j.js.Image
	}
	return r.cfg.Containers.Image
}

// stoppedBeforeStart reports the end of a job stopped before its process started.
func (r *runner) stoppedBeforeStart() (protocol.EndData, bool) {
	if r.j.ctx.Err() == nil {
		return protocol.EndData{}, false
	}
	end := causeEnd(context.Cause(r.j.ctx), -1, r.j.js.TimeoutS)
	end.Message += " (before ansible-playbook started)"
	return end, true
}

// supervise streams the running process's output and events into records until it has exited
// and both pipes are closed, and returns its end.
func (r *runner) supervise(g running, outR, evR *os.File) protocol.EndData {
	notes := make(chan protocol.LogData, 1)
	out, ev := newPipeReader(outR), newPipeReader(evR)
	var waitErr error
	var wg sync.WaitGroup
	wg.Add(4)
	go func() {
		defer wg.Done()
		waitErr = g.wait()
	}()
	go func() {
		defer wg.Done()
		r.watch(g, notes)
	}()
	go func() {
		defer wg.Done()
		out.run()
	}()
	go func() {
		defer wg.Done()
		ev.run()
	}()

	r.appendJSON(protocol.KindStart, protocol.StartData{PID: g.pid(), Instance: r.cfg.Instance, Playbook: r.j.js.Playbook, Image: r.image()})
	for _, n := range r.notes {
		r.appendLog(n.Level, "%s", n.Message)
	}

	outCh, evCh, exitedC := out.ch, ev.ch, g.exited()
	for outCh != nil || evCh != nil || exitedC != nil {
		select {
		case b, ok := <-outCh:
			if !ok {
				outCh = nil
				r.endOutput()
				continue
			}
			r.output(*b)
			putBuf(b)
		case b, ok := <-evCh:
			if !ok {
				evCh = nil
				r.endEvents()
				continue
			}
			r.events(*b)
			putBuf(b)
		case <-r.flush.C:
			r.flushArmed = false
			r.flushOutput()
			r.flushEvents()
		case n := <-notes:
			r.appendLog(n.Level, "%s", n.Message)
		case <-exitedC:
			exitedC = nil
			deadline := time.Now().Add(pipeCloseWait)
			_ = outR.SetReadDeadline(deadline)
			_ = evR.SetReadDeadline(deadline)
		}
	}
	wg.Wait()
	r.flush.Stop()
	outR.Close()
	evR.Close()
	select {
	case n := <-notes:
		r.appendLog(n.Level, "%s", n.Message)
	default:
	}
	for _, p := range []struct {
		name string
		err  error
	}{{"output", out.err}, {"events", ev.err}} {
		switch {
		case p.err == nil:
		case errors.Is(p.err, os.ErrDeadlineExceeded):
			r.appendLog(protocol.LevelWarn, "stopped reading %s %s after ansible-playbook exited: a process outside its process group still holds the pipe open", p.name, pipeCloseWait)
		default:
			r.appendLog(protocol.LevelError, "reading %s failed: %v", p.name, p.err)
		}
	}
	if r.notJSON > 0 || r.tooLong > 0 {
		r.appendLog(protocol.LevelWarn, "dropped %d event lines from the af_events plugin: %d not JSON, %d over %d bytes", r.notJSON+r.tooLong, r.notJSON, r.tooLong, maxEventBytes)
	}
	return r.endOf(g.status(), waitErr, g.wasSignaled())
}

// watch stops the process group (or container) once the job's context ends (cancel, timeout, drain, spool
// failure): SIGTERM, then SIGKILL if the process has not exited after KillGrace. It returns
// when the process has exited or SIGKILL was sent.
func (r *runner) watch(g running, notes chan<- protocol.LogData) {
	select {
	case <-g.exited():
		return
	case <-r.j.ctx.Done():
	}
	r.log.Info("stopping the job's "+g.what(), zap.String("cause", context.Cause(r.j.ctx).Error()))
	if !g.stop(r.cfg.KillGrace) {
		return
	}
	r.log.Warn(g.what()+" ignored SIGTERM; sent SIGKILL", zap.Duration("kill_grace", r.cfg.KillGrace))
	notes <- protocol.LogData{Level: protocol.LevelWarn, Message: fmt.Sprintf(
		"ansible-playbook did not exit within %s of SIGTERM; sent SIGKILL to its %s", r.cfg.KillGrace, g.what())}
}

// cleanup releases the prepared files and removes the job directory, secrets included.
func (r *runner) cleanup() {
	if r.ws.Release != nil {
		r.ws.Release()
	}
	if !r.made {
		return
	}
	if err := bundle.RemoveTree(r.dir); err != nil {
		r.log.Error("could not remove the job directory", zap.String("dir", r.dir), zap.Error(err))
		r.appendLog(protocol.LevelError, "could not remove the job directory %s: %v; remove it by hand, it may hold secret files", r.dir, err)
	}
}
