package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/rte-project/rte/internal/logging"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server"
	"github.com/rte-project/rte/server/session"
)

func serve(ctx context.Context, environ []string, stderr io.Writer, sigs <-chan os.Signal) int {
	s, ok := loadSettings(environ, stderr)
	if !ok {
		return exitSettings
	}
	logger, err := logging.New(s.LogLevel, s.LogFormat, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "rte: logger: %v\n", err)
		return exitSettings
	}
	defer func() { _ = logger.Sync() }()
	for _, w := range s.Warnings() {
		logger.Warn(w)
	}
	if err := absolutePaths(s); err != nil {
		logger.Error("rte stopped", zap.Error(err))
		return exitSettings
	}
	if list := preflight(s); len(list) > 0 {
		printProblems(&config.Problems{List: list}, stderr)
		return exitSettings
	}
	if err := serveSettings(ctx, s, environ, logger, sigs); err != nil {
		logger.Error("rte stopped", zap.Error(err))
		return exitFailure
	}
	logger.Info("rte stopped")
	return exitOK
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

// certificateHosts are the names the generated certificate covers: the host the app dials,
// and the local names an operator uses for probes.
func certificateHosts(s *config.Settings) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1", hostname()}
	if u, err := url.Parse(s.RTEURL); err == nil && u.Hostname() != "" {
		hosts = append([]string{u.Hostname()}, hosts...)
	}
	return hosts
}

// serveSettings runs the RTE until ctx is done or a signal stops it. The first signal drains:
// /ready turns 503, then the listener and the socket close. A second signal stops at once.
func serveSettings(ctx context.Context, s *config.Settings, environ []string, logger *zap.Logger, signals <-chan os.Signal) error {
	quit := make(chan struct{})
	defer close(quit)
	sigs := withoutHangups(signals, quit, logger)
	ver := buildVersion()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	token := string(s.Token)
	tokenFP := protocol.TokenFingerprint(token)
	startFields := []zap.Field{
		zap.String("name", s.Name), zap.String("mode", s.Mode), zap.String("version", ver),
		zap.String("listen", s.ListenAddr()), zap.Bool("https", s.HTTPS),
		zap.String("token_fingerprint", tokenFP),
	}
	var (
		tlsConfig *tls.Config
		identity  *pinning.Identity
	)
	if s.HTTPS {
		id, err := pinning.LoadOrCreate(s.HTTPSCert, s.HTTPSKey, certificateHosts(s))
		if err != nil {
			return err
		}
		if id.Created {
			logger.Info("generated a self-signed certificate", zap.String("cert", s.HTTPSCert), zap.String("key", s.HTTPSKey))
		}
		for _, w := range id.Warnings {
			logger.Warn(w)
		}
		identity = id
		startFields = append(startFields,
			zap.String("certificate_fingerprint", id.Fingerprint()),
			zap.String("certificate_sha256", id.SHA256()))
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{id.Certificate}, MinVersion: tls.VersionTLS12}
		registerCertificateExpiry(reg, id.Certificate.Leaf)
	}
	logger.Info("rte starting", startFields...)
	// One line with every effective setting (secrets redacted), so a support case starts from
	// what the RTE actually used rather than what the operator thinks was set.
	eff := s.Effective()
	settingFields := make([]zap.Field, 0, len(eff))
	for _, e := range eff {
		settingFields = append(settingFields, zap.String(e.Var, e.Value))
	}
	logger.Info("settings", settingFields...)

	// runner is made after the spool, whose restore already ends jobs; the metrics ask it
	// only once serving.
	var runner *jobs.Manager
	jobMet := newJobMetrics(reg, func() int {
		if runner == nil {
			return 0
		}
		return len(runner.Running())
	})
	sp, err := openSpool(s, logger, jobMet)
	if err != nil {
		return err
	}
	defer sp.Close()
	reg.MustRegister(newSpoolCollector(sp, s.SpoolPath))
	jobsDir, pluginDir, err := prepareWorkPath(s)
	if err != nil {
		return err
	}
	files, err := newFileSource(s, logger)
	if err != nil {
		return err
	}
	if files.cache != nil {
		reg.MustRegister(newCacheCollector(files.cache))
	}
	runner, err = jobs.New(jobs.Config{
		Logger:         logger.Named("jobs"),
		Recorder:       recorder{sp, jobMet},
		Files:          files,
		Token:          token,
		WorkDir:        files.workDir(jobsDir),
		PluginDir:      pluginDir,
		MaxJobs:        s.MaxJobs,
		MaxOutputBytes: s.ProcessMaxBuffer,
		Instance:       hostname(),
		BaseEnv:        jobs.PassEnv(environ, s.JobEnvAllowList()),
		EnvAllow:       s.JobEnvAllowList(),
		RanLedger:      filepath.Join(s.WorkPath, "ran-jobs"),
		Healthy:        sp.Healthy,
	})
	if err != nil {
		return err
	}
	defer runner.Wait()

	sessions := session.NewManager(session.Config{
		Logger:   logger,
		Registry: reg,
		Jobs:     runner,
		Outbox:   sp,
		Bundles:  files.bundles(),
		Checker:  newChecker(environ, logger),
		Hello: protocol.Hello{
			Name: s.Name, Version: ver, Instance: hostname(), Mode: s.Mode, Files: s.Files,
			MaxJobs: s.MaxJobs, TokenFingerprint: tokenFP, AnsibleVersion: ansibleVersion(logger),
		},
		PingInterval: s.PingInterval,
		DeadAfter:    s.DeadAfter,
	})
	files.fetch = sessions
	registerSocketState(reg, sessions)

	var (
		mu       sync.Mutex
		started  bool
		draining bool
	)
	ready := func() error {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !started:
			return errors.New("starting")
		case draining:
			return errors.New("draining")
		}
		if err := sp.Healthy(); err != nil {
			return fmt.Errorf("spool cannot be written: %w", err)
		}
		// Outbound, the RTE is only of use once its socket is up and the app has answered
		// the hello; inbound, the app dials whenever it likes, so that is no condition.
		if s.Mode == protocol.ModeOutbound {
			if !sessions.Connected() {
				return errors.New("no socket to the app: dialling APP_URL")
			}
			if _, ok := sessions.Welcomed(); !ok {
				return errors.New("socket to the app open, waiting for its welcome")
			}
		}
		return nil
	}
	srvConfig := server.Config{
		Token:        token,
		MetricsToken: string(s.MetricsToken),
		Logger:       logger,
		Registry:     reg,
		Version:      ver,
		Ready:        ready,
	}
	if s.Mode == protocol.ModeInbound {
		srvConfig.Sockets = sessions
	}
	srv, err := server.New(srvConfig)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", s.ListenAddr())
	if err != nil {
		return fmt.Errorf("listen on %s (PORT, LISTEN_HOST): %w", s.ListenAddr(), err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Add(2)
	go func() { defer wg.Done(); errs <- srv.Serve(runCtx, ln) }()
	go func() { defer wg.Done(); errs <- sessions.Run(runCtx) }()
	wg.Add(1)
	go func() { defer wg.Done(); files.run(runCtx) }()

	if s.Mode == protocol.ModeOutbound {
		dialer, err := appDialer(s, logger)
		if err != nil {
			stop()
			wg.Wait()
			return err
		}
		wg.Add(1)
		// Run returns an error only for settings it cannot work with, at once; that stops the RTE.
		go func() { defer wg.Done(); errs <- dialer.Run(runCtx, sessions) }()
	}

	if s.Mode == protocol.ModeInbound && s.AppURL != "" {
		client, err := appHTTPClient(s, logger)
		if err != nil {
			stop()
			wg.Wait()
			return err
		}
		req := protocol.RegisterRequest{
			Name: s.Name, URL: s.RTEURL, Token: token, JoinToken: string(s.JoinToken),
			Version: ver, MaxJobs: s.MaxJobs,
		}
		if identity != nil {
			req.Certificate = string(identity.PEM)
		}
		r := &pinning.Registrar{
			Client: client, AppURL: s.AppURL, Request: req,
			Logger: logger.Named("register"), OnState: srv.SetRegistrationState,
		}
		wg.Add(1)
		// Serving never waits for the registration: it runs beside it, and a refusal only logs.
		go func() {
			defer wg.Done()
			// Run logs every answer itself, a refusal included; the RTE keeps serving either way.
			_ = r.Run(runCtx)
		}()
	}

	mu.Lock()
	started = true
	mu.Unlock()

	var runErr error
	select {
	case sig := <-sigs:
		logger.Info("stopping", zap.String("signal", sig.String()))
		mu.Lock()
		draining = true
		mu.Unlock()
		srv.SetDraining()
		drain(runner, sp, sessions, s.DrainTimeout(), sigs, logger)
	case <-ctx.Done():
		drain(runner, sp, sessions, 0, sigs, logger)
	case runErr = <-errs:
		drain(runner, sp, sessions, 0, sigs, logger)
	}
	stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case sig := <-sigs:
		logger.Warn("second signal: exiting at once", zap.String("signal", sig.String()))
	case <-time.After(30 * time.Second):
		logger.Error("shutdown took longer than 30s; exiting")
	}
	return runErr
}

// withoutHangups passes on every signal but SIGHUP, which it logs. The RTE reads its settings
// once, at start, so a reload has nothing to do; and a terminal hang-up or a careless kill -HUP
// must not cut running jobs. The forwarding ends when quit closes.
func withoutHangups(sigs <-chan os.Signal, quit <-chan struct{}, logger *zap.Logger) <-chan os.Signal {
	out := make(chan os.Signal, 2)
	go func() {
		for {
			var sig os.Signal
			select {
			case sig = <-sigs:
			case <-quit:
				return
			}
			if sig == syscall.SIGHUP {
				logger.Info("SIGHUP ignored: settings are read once, at start; restart the RTE to change them (SIGTERM drains)")
				continue
			}
			select {
			case out <- sig:
			case <-quit:
				return
			}
		}
	}()
	return out
}

// drain stops taking jobs, lets running ones finish for grace, then stops the rest (they end
// abandoned), and finally gives the socket a short while to deliver what is spooled. Every
// end is in the spool when drain returns, delivered or not: the next start resends it. A
// signal during the drain stops the remaining jobs at once.
func drain(runner *jobs.Manager, sp *spool.Spool, sessions *session.Manager, grace time.Duration, sigs <-chan os.Signal, logger *zap.Logger) {
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_ = runner.Drain(context.Background(), grace)
	}()
	select {
	case <-drained:
	case sig := <-sigs:
		logger.Warn("second signal: stopping running jobs now", zap.String("signal", sig.String()))
		_ = runner.Drain(context.Background(), 0)
		<-drained
	}
	// Delivery is best effort here: records stay spooled until acked, across restarts.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && sessions.Connected() && unacked(sp) {
		time.Sleep(50 * time.Millisecond)
	}
	if unacked(sp) {
		logger.Info("records wait in the spool for the app", zap.Int("jobs", len(sp.Jobs())))
	}
}

func unacked(sp *spool.Spool) bool {
	for _, j := range sp.Jobs() {
		if j.Acked < j.LastSeq {
			return true
		}
	}
	return false
}
