package rte

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/rte-project/rte/internal/config"
)

// Options are what Run takes beside the settings: the process's inputs, passed in so that a
// test can drive an RTE in its own process.
type Options struct {
	// Environ is the RTE's own environment: the variables RTE_JOB_ENV_ALLOW passes into jobs
	// come from it, and HOME, where the connection checks find ~/.ssh. nil passes nothing.
	Environ []string
	// Signals stop the RTE: the first drains, a second stops at once. SIGHUP is logged and
	// otherwise ignored. nil: only ctx stops it.
	Signals <-chan os.Signal
	// Listener, when set, is served instead of a listener on PORT and LISTEN_HOST (HTTPS=1
	// wraps it in TLS). Run closes it.
	Listener net.Listener
	// Version is what the start line, hello, the registration and rte_build_info say
	// (BuildVersion's answer in the binary).
	Version string
	// ShutdownLimit bounds the wait for the RTE's goroutines after the drain; default
	// DefaultShutdownLimit. A second signal ends the wait at once.
	ShutdownLimit time.Duration
}

// DefaultShutdownLimit is how long Run waits, after the drain, for the listener, the socket
// and the cache's heartbeat to stop before it returns anyway: a supervisor that waits longer
// than RTE_DRAIN_SECONDS plus this kills the process, and the spool keeps what was not sent.
const DefaultShutdownLimit = 30 * time.Second

// SettingsError is a refusal to start for a reason that lies in the settings: the binary exits
// 2 for it, as for a bad value, so a supervisor does not restart in a loop.
type SettingsError struct{ Err error }

func (e *SettingsError) Error() string { return e.Err.Error() }
func (e *SettingsError) Unwrap() error { return e.Err }

// Run serves as the RTE described by s until ctx is done or a signal stops it, and returns
// once every goroutine it started has ended (or the shutdown limit ran out). It logs s's
// warnings, resolves s's paths against the working directory (s is changed), and checks the
// files and folders s names before it opens anything: problems there come back as
// *config.Problems, unusable paths as *SettingsError, and nothing was started. Any other error
// is a failure of a running RTE. A drain that ends jobs abandoned is no error: their ends are
// spooled.
func Run(ctx context.Context, s *config.Settings, log *zap.Logger, opts Options) error {
	for _, w := range s.Warnings() {
		log.Warn(w)
	}
	if err := absolutePaths(s); err != nil {
		return &SettingsError{Err: err}
	}
	if list := preflight(s); len(list) > 0 {
		return &config.Problems{List: list}
	}
	if opts.ShutdownLimit <= 0 {
		opts.ShutdownLimit = DefaultShutdownLimit
	}
	// A listener handed over is the caller's until here; from now on Run closes it, even
	// when the start fails.
	ln := opts.Listener
	r := &rte{s: s, log: log, opts: opts, reg: prometheus.NewRegistry()}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	err := r.run(ctx, ln)
	if err != nil && ln != nil && !r.listening {
		_ = ln.Close()
	}
	return err
}

// Check is check-config's answer beyond the settings' own problems: the paths resolved as Run
// resolves them (s is changed), then what Run would refuse in the files and folders they name.
// Run and check-config use the same checks, so the two cannot disagree.
func Check(s *config.Settings) []config.Problem {
	if err := absolutePaths(s); err != nil {
		return []config.Problem{{Var: "paths", Message: err.Error()}}
	}
	return preflight(s)
}

// Hostname is this machine's name, "localhost" when it has none: the default RTE_NAME's middle,
// the instance in hello, and a name the generated certificate covers.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "localhost"
	}
	return h
}

// absolutePaths resolves the settings' paths against the working directory once, at start:
// ansible-playbook runs in each job's own directory, so a relative path handed down would
// point somewhere else there.
func absolutePaths(s *config.Settings) error {
	for _, p := range []*string{&s.SpoolPath, &s.WorkPath, &s.CachePath, &s.AnsiblePath, &s.RepoPath, &s.HTTPSCert, &s.HTTPSKey} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("resolve %s: %w", *p, err)
		}
		*p = abs
	}
	return nil
}
