package rte

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/jobs/afevents"
	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
)

// openSpool opens the spool and ends every job that was running when the RTE last stopped:
// its process died with the RTE, so it gets a log record saying so and an end "abandoned".
func openSpool(s *config.Settings, logger *zap.Logger, met *jobMetrics) (*spool.Spool, error) {
	sp, err := spool.Open(s.SpoolPath, spool.Options{Logger: logger.Named("spool")})
	if err != nil {
		return nil, fmt.Errorf("open spool (RTE_SPOOL_PATH): %w", err)
	}
	for _, j := range sp.Jobs() {
		if j.Ended {
			continue
		}
		if pid := startPID(sp, j.Job); pid > 0 {
			if n, err := jobs.KillLeftovers(j.Job, pid); err != nil {
				logger.Warn("could not look for processes left by a job", zap.String("job", j.Job), zap.Error(err))
			} else if n > 0 {
				logger.Warn("stopped processes left running by the previous start", zap.String("job", j.Job), zap.Int("processes", n))
			}
		}
		logData, _ := json.Marshal(protocol.LogData{Level: protocol.LevelError,
			Message: "the RTE stopped while this job ran (killed, crashed or restarted); its process is gone"})
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
