package rte

import (
	"os/user"
	"path/filepath"

	"github.com/caarlos0/env/v11"
	"go.uber.org/zap"

	"github.com/rte-project/rte/internal/check"
	"github.com/rte-project/rte/server/session"
)

// newChecker builds the connection checker over the ssh directory of the user the RTE runs
// as: $HOME/.ssh from the environment the RTE got, as ansible's ssh would find it. A missing
// directory is fine (the checks then answer auth_failed or host_key_unknown, saying which file
// is missing). Without any home directory the RTE still serves jobs and answers every check
// "unexpected"; the log says why. It returns nil then, which session takes as "no checker".
func newChecker(environ []string, logger *zap.Logger) session.Checker {
	home := env.ToMap(environ)["HOME"]
	if home == "" {
		if u, err := user.Current(); err == nil {
			home = u.HomeDir
		}
	}
	if home == "" {
		logger.Warn("connection checks are off: the RTE's user has no home directory to find ~/.ssh in; set HOME")
		return nil
	}
	sshDir := filepath.Join(home, ".ssh")
	ch, err := check.New(check.Config{SSHDir: sshDir, Logger: logger})
	if err != nil {
		logger.Warn("connection checks are off", zap.Error(err))
		return nil
	}
	logger.Info("connection checks use this ssh directory", zap.String("ssh_dir", sshDir))
	return ch
}
