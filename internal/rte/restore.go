package rte

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/jobs/afevents"
	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
)

// openSpool opens the spool and ends every job that was running when the RTE last stopped:
// its process died with the RTE, so it gets a log record saying so and an end "abandoned".
// removed names the jobs whose containers removeLeftContainers removed just before.
func openSpool(s *config.Settings, logger *zap.Logger, met *jobMetrics, removed map[string]bool) (*spool.Spool, error) {
	sp, err := spool.Open(s.SpoolPath, spool.Options{Logger: logger.Named("spool")})
	if err != nil {
		return nil, fmt.Errorf("open spool (RTE_SPOOL_PATH): %w", err)
	}
	for _, j := range sp.Jobs() {
		if j.Ended {
			continue
		}
		if pid := startPID(sp, j.Job); pid > 0 && !removed[j.Job] {
			if n, err := jobs.KillLeftovers(j.Job, pid); err != nil {
				logger.Warn("could not look for processes left by a job", zap.String("job", j.Job), zap.Error(err))
			} else if n > 0 {
				logger.Warn("stopped processes left running by the previous start", zap.String("job", j.Job), zap.Int("processes", n))
			}
		}
		msg := "the RTE stopped while this job ran (killed, crashed or restarted); its process is gone"
		if removed[j.Job] {
			msg = "the RTE stopped while this job ran (killed, crashed or restarted); its container was stopped and removed"
		}
		logData, _ := json.Marshal(protocol.LogData{Level: protocol.LevelError, Message: msg})
		endData, _ := json.Marshal(protocol.EndData{Status: protocol.StatusAbandoned, ExitCode: -1,
			Message: "the RTE restarted while the job ran"})
		if _, err := sp.Append(j.Job, protocol.KindLog, logData); err != nil {
			return nil, fmt.Errorf("restore spool: job %s: %w", j.Job, err)
		}
		if _, err := sp.Append(j.Job, protocol.KindEnd, endData); err != nil {
			return nil, fmt.Errorf("restore spool: job %s: %w", j.Job, err)
		}
		met.record(j.Job, protocol.KindEnd, endData)
		logger.Warn("ended a job left running by the previous start", zap.String("job", j.Job), zap.Int64("last_seq", j.LastSeq))
	}
	return sp, nil
}

// removeLeftContainers removes the job containers the previous start of this RTE left (it was
// killed, or the engine could not remove them), before their jobs are ended abandoned and
// their directories emptied: nobody reads them any more, and reattaching is not done (see
// docs/engines.md). It returns the jobs whose containers it removed. An engine that does not
// answer is logged, not fatal: /ready says so, and the next start tries again.
func removeLeftContainers(cfg *jobs.ContainerConfig, logger *zap.Logger) map[string]bool {
	removed := map[string]bool{}
	if cfg == nil {
		return removed
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids, err := jobs.RemoveContainers(ctx, *cfg)
	for _, id := range ids {
		removed[id] = true
		logger.Warn("removed a job container left by the previous start", zap.String("job", id))
	}
	if err != nil {
		logger.Error("could not remove the job containers left by the previous start; they are tried again at the next start", zap.Error(err))
	}
	return removed
}

// startPID is the pid in a job's start record (its process group), or 0.
func startPID(sp *spool.Spool, job string) int {
	pid := 0
	errStop := errors.New("stop")
	_ = sp.Pending(job, 0, func(rec protocol.Record, _ []byte) error {
		if rec.Kind == protocol.KindStart {
			var d protocol.StartData
			if json.Unmarshal(rec.Data, &d) == nil {
				pid = d.PID
			}
		}
		return errStop
	})
	return pid
}

// prepareWorkPath makes RTE_WORK_PATH with the callback plugin in it, and empties the job
// directories a previous start left behind (a crash skips their cleanup, and they may hold
// secret files). Job directories live in their own subdirectory so that no job id can collide
// with the plugin's.
func prepareWorkPath(s *config.Settings) (jobsDir, pluginDir string, err error) {
	if err := os.MkdirAll(s.WorkPath, 0o700); err != nil {
		return "", "", fmt.Errorf("make RTE_WORK_PATH %s: %w", s.WorkPath, err)
	}
	jobsDir = filepath.Join(s.WorkPath, "jobs")
	if err := os.RemoveAll(jobsDir); err != nil {
		return "", "", fmt.Errorf("remove job directories left in %s: %w", jobsDir, err)
	}
	if err := os.MkdirAll(jobsDir, 0o700); err != nil {
		return "", "", fmt.Errorf("make %s: %w", jobsDir, err)
	}
	pluginDir, err = afevents.Install(filepath.Join(s.WorkPath, "plugins"))
	if err != nil {
		return "", "", fmt.Errorf("install the af_events callback plugin: %w", err)
	}
	return jobsDir, pluginDir, nil
}
