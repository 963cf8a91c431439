package jobs

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/rte-project/rte/protocol"
	"go.uber.org/zap"
)

// recording is the runner's side of the Recorder.
type recording struct {
	spoolErr error // the first failed Append; nothing but the end is tried after it
	// unsynced holds the Commits of records written but not yet known durable, oldest first
	// (only with a Committer Recorder).
	unsynced []Commit
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

// endRetryEvery is how often a job's end is tried again while the spool cannot take it.
var endRetryEvery = time.Second

// appendEnd records the job's last record. After a spool failure (a full disk) it is tried
// until the spool takes it: a job whose end is never spooled would stay running at the app,
// since the RTE reports it spooled and never ends it. Only a drain whose grace ran out stops
// the retries; the job's spool file then has no end, and the next start ends it abandoned.
func (r *runner) appendEnd(end protocol.EndData) {
	end.Message = protocol.PeerText(end.Message, maxLogMessage)
	r.settle(len(r.unsynced))
	data, err := json.Marshal(end)
	if err != nil {
		// Only EndData comes here, and it always encodes.
		r.log.Error("encode the job's end", zap.Error(err))
		return
	}
	for tries := 1; ; tries++ {
		_, err := r.cfg.Recorder.Append(r.j.id, protocol.KindEnd, data)
		if err == nil {
			r.log.Info("job ended", zap.String("status", end.Status), zap.Int("exit_code", end.ExitCode), zap.String("message", end.Message), zap.Int("tries", tries))
			return
		}
		if tries == 1 {
			r.log.Error("could not record the job's end; trying again until the spool has room", zap.String("status", end.Status),
				zap.Duration("every", endRetryEvery), zap.Error(err))
		}
		select {
		case <-time.After(endRetryEvery):
		case <-r.m.givenUp:
			r.log.Error("gave up recording the job's end: the drain ran out; the next start ends it abandoned", zap.String("status", end.Status), zap.Int("tries", tries), zap.Error(err))
			return
		}
	}
}
