package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

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
// so they are in order.
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

	spoolErr error // the first failed Append; nothing but the end is tried after it
	// unsynced holds the Commits of records written but not yet known durable, oldest first
	// (only with a Committer Recorder).
	unsynced []Commit

	// Output: raw bytes -> cut at MaxOutputBytes -> masker -> valid UTF-8 -> batch.
	mask      *masker
	utf       validUTF8
	outBatch  *[]byte // text, not yet encoded; nil when empty
	outSeen   int64
	cut       bool
	discarded int64

	// Events: lines -> masked -> batch.
	evBatch   *[]byte // {"events":[... ; nil when empty
	evCount   int
	evLine    []byte // an unfinished line
	evSkip    bool   // discarding the rest of an over-long line
	evNext    []int
	evScratch []byte
	notJSON   int
	tooLong   int

	flush      *time.Timer
	flushArmed bool
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
		m:       m,
		j:       j,
		cfg:     &m.cfg,
		log:     m.log.With(zap.String("job", j.id)),
		dir:     filepath.Join(m.cfg.WorkDir, j.id),
		secrets: s,
		mask:    newMasker(s.output),
		evNext:  make([]int, len(s.events)),
		flush:   t,
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
	if err := removeAll(r.dir); err != nil {
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
	priv, err := writePrivate(r.dir, r.j.js, r.j.secrets)
	if err != nil {
		return errorEnd("write job files: %v", err)
	}
	for _, name := range sortedKeys(priv.secrets) {
		r.notes = append(r.notes, protocol.LogData{Level: protocol.LevelInfo, Message: fmt.Sprintf(
			"%s given to ansible-playbook in a 0600 file of the job directory (%s); its value is masked in output and events",
			name, secretOptions[name])})
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		return errorEnd("make output pipe: %v", err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return errorEnd("make events pipe: %v", err)
	}
	cmd := &exec.Cmd{
		Path:       r.m.binary,
		Args:       append([]string{r.m.binary}, buildArgs(r.j.js, ws, priv)...),
		Env:        append(buildEnv(r.cfg.BaseEnv, r.j.js.Env, pluginEnv(r.cfg.PluginDir), priv.tmp), JobIDEnv+"="+r.j.id),
		Dir:        ws.Dir,
		Stdout:     outW, // one pipe for both keeps their order
		Stderr:     outW,
		ExtraFiles: []*os.File{evW}, // fd 3, eventsFD
		// Pdeathsig stops ansible-playbook if the RTE dies without stopping it; what it
		// forked is found again by KillLeftovers when the RTE restarts.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	}
	err = cmd.Start()
	// The child has its copies; without closing ours, the pipes never reach EOF.
	outW.Close()
	evW.Close()
	if err != nil {
		outR.Close()
		evR.Close()
		return errorEnd("start %s: %v", r.m.binary, err)
	}
	r.log.Info("ansible-playbook started", zap.Int("pid", cmd.Process.Pid))
	return r.supervise(cmd, outR, evR)
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
func (r *runner) supervise(cmd *exec.Cmd, outR, evR *os.File) protocol.EndData {
	g := &group{pgid: cmd.Process.Pid}
	exited := make(chan struct{})
	notes := make(chan protocol.LogData, 1)
	out, ev := newPipeReader(outR), newPipeReader(evR)
	var waitErr error
	var wg sync.WaitGroup
	wg.Add(4)
	go func() {
		defer wg.Done()
		waitErr = g.reap(cmd)
		close(exited)
	}()
	go func() {
		defer wg.Done()
		r.watch(g, exited, notes)
	}()
	go func() {
		defer wg.Done()
		out.run()
	}()
	go func() {
		defer wg.Done()
		ev.run()
	}()

	r.appendJSON(protocol.KindStart, protocol.StartData{PID: cmd.Process.Pid, Instance: r.cfg.Instance, Playbook: r.j.js.Playbook})
	for _, n := range r.notes {
		r.appendLog(n.Level, "%s", n.Message)
	}

	outCh, evCh, exitedC := out.ch, ev.ch, exited
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
	return r.endOf(cmd.ProcessState, waitErr, g.wasSignaled())
}

// watch stops the process group once the job's context ends (cancel, timeout, drain, spool
// failure): SIGTERM, then SIGKILL if the process has not exited after KillGrace. It returns
// when the process has exited.
func (r *runner) watch(g *group, exited <-chan struct{}, notes chan<- protocol.LogData) {
	select {
	case <-exited:
		return
	case <-r.j.ctx.Done():
	}
	r.log.Info("stopping the job's process group", zap.String("cause", context.Cause(r.j.ctx).Error()))
	g.signal(syscall.SIGTERM)
	t := time.NewTimer(r.cfg.KillGrace)
	defer t.Stop()
	select {
	case <-exited:
		return
	case <-t.C:
	}
	g.signal(syscall.SIGKILL)
	r.log.Warn("process group ignored SIGTERM; sent SIGKILL", zap.Duration("kill_grace", r.cfg.KillGrace))
	notes <- protocol.LogData{Level: protocol.LevelWarn, Message: fmt.Sprintf(
		"ansible-playbook did not exit within %s of SIGTERM; sent SIGKILL to its process group", r.cfg.KillGrace)}
}

// group is a job's process group. Its id stays ours while the leader is unreaped (a zombie
// keeps its pid), so signals go out only until then: never to a group id the kernel has
// handed to someone else.
type group struct {
	pgid     int
	mu       sync.Mutex
	reaped   bool
	signaled bool
}

func (g *group) signal(sig syscall.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reaped {
		return
	}
	g.signaled = true
	_ = syscall.Kill(-g.pgid, sig)
}

func (g *group) wasSignaled() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.signaled
}

// reap waits for the leader to exit, kills what it left in its group (nothing of a job outlives
// it), then reaps the leader.
func (g *group) reap(cmd *exec.Cmd) error {
	if err := waitExited(g.pgid); err == nil {
		g.mu.Lock()
		if !g.reaped {
			_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
		}
		g.mu.Unlock()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reaped = true
	return cmd.Wait()
}

// output takes a piece of stdout and stderr.
func (r *runner) output(p []byte) {
	if r.spoolErr != nil {
		return
	}
	if r.cut {
		r.discarded += int64(len(p))
		return
	}
	if limit := r.cfg.MaxOutputBytes; limit > 0 && r.outSeen+int64(len(p)) > limit {
		keep := limit - r.outSeen
		r.outputText(p[:keep])
		r.outSeen = limit
		r.discarded += int64(len(p)) - keep
		r.cut = true
		// The held bytes may be the start of a secret whose end is discarded: drop them.
		r.mask.drop()
		r.endText()
		r.appendLog(protocol.LevelWarn, "output cut at %d bytes (PROCESS_MAX_BUFFER); the rest is read and discarded, events and the end still follow", limit)
		return
	}
	r.outSeen += int64(len(p))
	r.outputText(p)
}

func (r *runner) outputText(p []byte) {
	masked := getBuf()
	valid := getBuf()
	*masked = r.mask.write((*masked)[:0], p)
	*valid = r.utf.write((*valid)[:0], *masked)
	r.addOutput(*valid)
	releaseBuf(masked)
	releaseBuf(valid)
}

// endOutput ends the output stream: what the masker and the UTF-8 check held goes out.
func (r *runner) endOutput() {
	if r.spoolErr != nil || r.cut {
		return
	}
	held := getBuf()
	*held = r.mask.flush((*held)[:0])
	valid := getBuf()
	*valid = r.utf.write((*valid)[:0], *held)
	*valid = r.utf.flush(*valid)
	r.addOutput(*valid)
	releaseBuf(held)
	releaseBuf(valid)
	r.flushOutput()
}

// endText flushes the UTF-8 check and the batch, as at the end of the stream.
func (r *runner) endText() {
	valid := getBuf()
	*valid = r.utf.flush((*valid)[:0])
	r.addOutput(*valid)
	releaseBuf(valid)
	r.flushOutput()
}

// addOutput adds valid text to the output batch, appending full batches; a batch ends on a
// rune boundary.
func (r *runner) addOutput(s []byte) {
	for len(s) > 0 {
		if r.outBatch == nil {
			r.outBatch = getBuf()
		}
		room := r.cfg.BatchBytes - len(*r.outBatch)
		if len(s) <= room {
			*r.outBatch = append(*r.outBatch, s...)
			r.armFlush()
			return
		}
		n := runeCut(s, room)
		*r.outBatch = append(*r.outBatch, s[:n]...)
		r.flushOutput()
		s = s[n:]
	}
}

func (r *runner) flushOutput() {
	if r.outBatch == nil {
		return
	}
	text := r.outBatch
	r.outBatch = nil
	if len(*text) > 0 {
		enc := getBuf()
		*enc = append((*enc)[:0], `{"text":`...)
		*enc = appendJSONString(*enc, *text)
		*enc = append(*enc, '}')
		r.append(protocol.KindOutput, bytes.Clone(*enc))
		releaseBuf(enc)
	}
	releaseBuf(text)
}

// events takes a piece of the events pipe: newline-separated JSON events.
func (r *runner) events(p []byte) {
	if r.spoolErr != nil {
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			r.partialEvent(p)
			return
		}
		line := p[:i]
		p = p[i+1:]
		if r.evSkip {
			r.evSkip = false
			continue
		}
		if len(r.evLine) > 0 {
			r.evLine = append(r.evLine, line...)
			line = r.evLine
		}
		if len(line) > maxEventBytes {
			r.tooLong++
		} else {
			r.addEvent(line)
		}
		r.evLine = shrink(r.evLine)
	}
}

func (r *runner) partialEvent(p []byte) {
	if r.evSkip {
		return
	}
	if len(r.evLine)+len(p) > maxEventBytes {
		r.tooLong++
		r.evSkip = true
		r.evLine = nil
		return
	}
	r.evLine = append(r.evLine, p...)
}

// endEvents ends the events stream: a last line without a newline still counts.
func (r *runner) endEvents() {
	if r.spoolErr != nil {
		return
	}
	if len(r.evLine) > 0 && !r.evSkip {
		r.addEvent(r.evLine)
	}
	r.evLine = nil
	r.flushEvents()
}

func (r *runner) addEvent(line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	var ok bool
	r.evScratch, ok = maskEvent(r.evScratch[:0], line, r.secrets, r.evNext)
	if !ok {
		r.notJSON++
		return
	}
	ev := r.evScratch
	if r.evBatch != nil && len(*r.evBatch)+len(ev)+3 > r.cfg.BatchBytes {
		r.flushEvents()
	}
	if r.evBatch == nil {
		r.evBatch = getBuf()
		*r.evBatch = append((*r.evBatch)[:0], `{"events":[`...)
	} else {
		*r.evBatch = append(*r.evBatch, ',')
	}
	*r.evBatch = append(*r.evBatch, ev...)
	r.evCount++
	r.evScratch = shrink(r.evScratch)
	r.armFlush()
}

// shrink empties b, and lets it go when it is large: one large event must not pin its buffer
// for the rest of the job.
func shrink(b []byte) []byte {
	if cap(b) > 4*readSize {
		return nil
	}
	return b[:0]
}

func (r *runner) flushEvents() {
	if r.evBatch == nil {
		return
	}
	*r.evBatch = append(*r.evBatch, ']', '}')
	r.append(protocol.KindEvents, bytes.Clone(*r.evBatch))
	releaseBuf(r.evBatch)
	r.evBatch = nil
	r.evCount = 0
}

// armFlush makes sure a batch waits at most BatchInterval.
func (r *runner) armFlush() {
	if !r.flushArmed {
		r.flush.Reset(r.cfg.BatchInterval)
		r.flushArmed = true
	}
}

// append hands a record to the Recorder. After the first failure nothing more is appended (so
// the order holds): the job is stopped and only its end is tried.
func (r *runner) append(kind string, data []byte) {
	if r.spoolErr != nil {
		return
	}
	if c, ok := r.cfg.Recorder.(Committer); ok && (kind == protocol.KindOutput || kind == protocol.KindEvents) {
		commit, err := c.AppendAsync(r.j.id, kind, data)
		if err != nil {
			r.spoolFailed(kind, err)
			return
		}
		r.unsynced = append(r.unsynced, commit)
		if len(r.unsynced) > maxUnsynced {
			r.settle(1)
		}
		return
	}
	// Every other record waits for what was written before it, so a log or the end is never
	// reported durable ahead of output that is not.
	r.settle(len(r.unsynced))
	if r.spoolErr != nil {
		return
	}
	if _, err := r.cfg.Recorder.Append(r.j.id, kind, data); err != nil {
		r.spoolFailed(kind, err)
	}
}

// settle waits for the n oldest written records to be durable.
func (r *runner) settle(n int) {
	for ; n > 0 && len(r.unsynced) > 0; n-- {
		c := r.unsynced[0]
		r.unsynced = r.unsynced[1:]
		if _, err := c.Wait(); err != nil && r.spoolErr == nil {
			r.spoolFailed("output", err)
		}
	}
}

func (r *runner) spoolFailed(kind string, err error) {
	r.spoolErr = fmt.Errorf("append %s record: %w", kind, err)
	r.log.Error("spool append failed; stopping the job", zap.String("kind", kind), zap.Error(err))
	r.j.cancel(r.spoolErr)
}

func (r *runner) appendJSON(kind string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		// Only the protocol's data structs come here, and they always encode.
		r.log.Error("encode record", zap.String("kind", kind), zap.Error(err))
		return
	}
	r.append(kind, data)
}

func (r *runner) appendLog(level, format string, args ...any) {
	r.appendJSON(protocol.KindLog, protocol.LogData{Level: level, Message: protocol.PeerText(fmt.Sprintf(format, args...), maxLogMessage)})
}

// appendEnd records the job's last record. After a spool failure it is still tried once, so the
// app learns why the job stopped if the spool has recovered.
func (r *runner) appendEnd(end protocol.EndData) {
	end.Message = protocol.PeerText(end.Message, maxLogMessage)
	r.settle(len(r.unsynced))
	data, err := json.Marshal(end)
	if err == nil {
		_, err = r.cfg.Recorder.Append(r.j.id, protocol.KindEnd, data)
	}
	if err != nil {
		r.log.Error("could not record the job's end; the spool will not have it", zap.String("status", end.Status), zap.Error(err))
		return
	}
	r.log.Info("job ended", zap.String("status", end.Status), zap.Int("exit_code", end.ExitCode), zap.String("message", end.Message))
}

// cleanup releases the prepared files and removes the job directory, secrets included.
func (r *runner) cleanup() {
	if r.ws.Release != nil {
		r.ws.Release()
	}
	if !r.made {
		return
	}
	if err := removeAll(r.dir); err != nil {
		r.log.Error("could not remove the job directory", zap.String("dir", r.dir), zap.Error(err))
		r.appendLog(protocol.LevelError, "could not remove the job directory %s: %v; remove it by hand, it may hold secret files", r.dir, err)
	}
}

// removeAll removes dir even when a playbook left read-only directories in it.
func removeAll(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// endOf decides a started job's end from how its process ended and why it was stopped.
func (r *runner) endOf(state *os.ProcessState, waitErr error, signaled bool) protocol.EndData {
	r.settle(len(r.unsynced))
	code := exitCode(state)
	if r.spoolErr != nil {
		return protocol.EndData{Status: protocol.StatusError, ExitCode: code, Message: fmt.Sprintf(
			"spool failed (%v); the job was stopped and its records after that point are lost: check the spool volume's free space and health", r.spoolErr)}
	}
	if signaled {
		return causeEnd(context.Cause(r.j.ctx), code, r.j.js.TimeoutS)
	}
	if state == nil {
		return protocol.EndData{Status: protocol.StatusError, ExitCode: code, Message: fmt.Sprintf("wait for ansible-playbook: %v", waitErr)}
	}
	if code == 0 {
		return protocol.EndData{Status: protocol.StatusSuccess, ExitCode: 0, Message: "ansible-playbook exited 0"}
	}
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return protocol.EndData{Status: protocol.StatusFailed, ExitCode: code, Message: fmt.Sprintf(
			"ansible-playbook was killed by signal %d (%v), not by the RTE", int(ws.Signal()), ws.Signal())}
	}
	return protocol.EndData{Status: protocol.StatusFailed, ExitCode: code, Message: fmt.Sprintf("ansible-playbook exited %d: %s", code, exitMeaning(code))}
}

// causeEnd is the end of a job the RTE stopped.
func causeEnd(cause error, code, timeoutS int) protocol.EndData {
	switch {
	case errors.Is(cause, errCanceled):
		return protocol.EndData{Status: protocol.StatusCanceled, ExitCode: code, Message: "canceled by the app (job.cancel)"}
	case errors.Is(cause, errTimeout):
		return protocol.EndData{Status: protocol.StatusTimeout, ExitCode: code, Message: fmt.Sprintf("ran longer than timeout_s (%d s) and was stopped", timeoutS)}
	case errors.Is(cause, errAbandoned):
		return protocol.EndData{Status: protocol.StatusAbandoned, ExitCode: code, Message: "the RTE was draining and RTE_DRAIN_SECONDS ran out; the job was stopped"}
	case cause == nil:
		return protocol.EndData{Status: protocol.StatusError, ExitCode: code, Message: "stopped for no recorded reason"}
	}
	return protocol.EndData{Status: protocol.StatusError, ExitCode: code, Message: cause.Error()}
}

// exitCode is the process's exit status, 128+signal when a signal ended it (the shell's
// convention), or -1 when there is no process state.
func exitCode(state *os.ProcessState) int {
	if state == nil {
		return -1
	}
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return state.ExitCode()
}

// Exit statuses of ansible-core 2.14 (lib/ansible/cli/__init__.py and TaskQueueManager).
var exitMeanings = map[int]string{
	1:   "ansible reported an error (see the output)",
	2:   "one or more hosts failed",
	3:   "one or more hosts were unreachable",
	4:   "one or more hosts were unreachable, or the playbook could not be parsed",
	5:   "bad or incomplete command line options",
	6:   "command line arguments are not UTF-8",
	99:  "ansible-playbook was interrupted",
	250: "an unexpected error inside ansible (see the traceback in the output)",
	255: "an unknown error inside ansible",
}

func exitMeaning(code int) string {
	if s, ok := exitMeanings[code]; ok {
		return s
	}
	return "see the output"
}

func errorEnd(format string, args ...any) protocol.EndData {
	return protocol.EndData{Status: protocol.StatusError, ExitCode: -1, Message: fmt.Sprintf(format, args...)}
}

// Scratch and batch buffers, shared by every job so that an idle job holds none.
var bufs = sync.Pool{New: func() any { return new([]byte) }}

func getBuf() *[]byte {
	b := bufs.Get().(*[]byte)
	*b = (*b)[:0]
	return b
}

func releaseBuf(b *[]byte) {
	if cap(*b) <= 4*DefaultBatchBytes {
		bufs.Put(b)
	}
}
