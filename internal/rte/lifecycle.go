package rte

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server"
	"github.com/rte-project/rte/server/session"
)

// rte is one run of the RTE: the pieces Run assembles, in the order it opens them.
type rte struct {
	s    *config.Settings
	log  *zap.Logger
	opts Options
	reg  *prometheus.Registry

	identity *pinning.Identity // HTTPS=1: the listener's certificate
	tls      *tls.Config       // nil without HTTPS
	spool    *spool.Spool
	files    *fileSource
	runner   *jobs.Manager
	sessions *session.Manager
	srv      *server.Server
	ready    readiness

	listening bool // the listener is served, and closed by the server
}

// run opens the pieces, serves, and on the first signal or the end of ctx drains and stops.
func (r *rte) run(ctx context.Context, ln net.Listener) error {
	// Signals are forwarded until run returns; SIGHUP never reaches the drain.
	quit := make(chan struct{})
	defer close(quit)
	sigs := withoutHangups(r.opts.Signals, quit, r.log)

	if err := r.openIdentity(); err != nil {
		return err
	}
	r.logStart()
	if err := r.openJobs(); err != nil {
		return err
	}
	defer r.spool.Close()
	// Heartbeats start as soon as the cache is open, not once the listener serves: what
	// comes between (asking ansible-playbook for its version, TLS, the listener) may take
	// seconds on a loaded host, and another RTE sharing the cache would sweep this one's
	// directory as stale meanwhile if RTE_CACHE_STALE_AFTER is short. They stop last.
	beatCtx, stopBeats := context.WithCancel(ctx)
	beating := make(chan struct{})
	go func() { defer close(beating); r.files.run(beatCtx) }()
	defer func() { stopBeats(); <-beating }()
	// Wait before the spool closes: a job's last records go there; then the engine's
	// connection goes.
	defer func() {
		r.runner.Wait()
		_ = r.runner.Close()
	}()
	r.openSessions()
	if err := r.openServer(); err != nil {
		return err
	}
	ln, err := r.listen(ln)
	if err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Add(2)
	r.listening = true
	go func() { defer wg.Done(); errs <- r.srv.Serve(runCtx, ln) }()
	go func() { defer wg.Done(); errs <- r.sessions.Run(runCtx) }()
	if err := r.reachApp(runCtx, &wg, errs); err != nil {
		stop()
		wg.Wait()
		return err
	}
	r.ready.start()

	var runErr error
	select {
	case sig := <-sigs:
		r.log.Info("stopping", zap.String("signal", sig.String()))
		r.ready.drain()
		r.srv.SetDraining()
		r.drain(r.s.DrainTimeout(), sigs)
	case <-ctx.Done():
		r.drain(0, sigs)
	case runErr = <-errs:
		r.drain(0, sigs)
	}
	stop()
	r.waitStopped(&wg, sigs)
	return runErr
}

// openIdentity loads or makes the listener's certificate when HTTPS=1.
func (r *rte) openIdentity() error {
	if !r.s.HTTPS {
		return nil
	}
	id, err := pinning.LoadOrCreate(r.s.HTTPSCert, r.s.HTTPSKey, certificateHosts(r.s))
	if err != nil {
		return err
	}
	if id.Created {
		r.log.Info("generated a self-signed certificate", zap.String("cert", r.s.HTTPSCert), zap.String("key", r.s.HTTPSKey))
	}
	for _, w := range id.Warnings {
		r.log.Warn(w)
	}
	r.identity = id
	r.tls = &tls.Config{Certificates: []tls.Certificate{id.Certificate}, MinVersion: tls.VersionTLS12}
	registerCertificateExpiry(r.reg, id.Certificate.Leaf)
	return nil
}

// certificateHosts are the names the generated certificate covers: the host the app dials,
// and the local names an operator uses for probes.
func certificateHosts(s *config.Settings) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1", Hostname()}
	if u, err := url.Parse(s.RTEURL); err == nil && u.Hostname() != "" {
		hosts = append([]string{u.Hostname()}, hosts...)
	}
	return hosts
}

// logStart writes the start line, then one line with every effective setting (secrets
// redacted), so a support case starts from what the RTE actually used rather than what the
// operator thinks was set.
func (r *rte) logStart() {
	fields := []zap.Field{
		zap.String("name", r.s.Name), zap.String("mode", r.s.Mode), zap.String("version", r.opts.Version),
		zap.String("listen", r.s.ListenAddr()), zap.Bool("https", r.s.HTTPS),
		zap.String("token_fingerprint", protocol.TokenFingerprint(string(r.s.Token))),
	}
	if r.identity != nil {
		fields = append(fields,
			zap.String("certificate_fingerprint", r.identity.Fingerprint()),
			zap.String("certificate_sha256", r.identity.SHA256()))
	}
	r.log.Info("rte starting", fields...)
	eff := r.s.Effective()
	settings := make([]zap.Field, 0, len(eff))
	for _, e := range eff {
		settings = append(settings, zap.String(e.Var, e.Value))
	}
	r.log.Info("settings", settings...)
}

// openJobs opens the spool (ending the jobs the last start left running), the work path, the
// files and the jobs Manager. On error nothing stays open.
func (r *rte) openJobs() (err error) {
	// The runner is made after the spool, whose restore already ends jobs; the metrics ask it
	// only once serving.
	met := newJobMetrics(r.reg, func() int {
		if r.runner == nil {
			return 0
		}
		return len(r.runner.Running())
	})
	containers := r.containerConfig()
	removed := removeLeftContainers(containers, r.log)
	if r.spool, err = openSpool(r.s, r.log, met, removed); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			r.spool.Close()
		}
	}()
	r.reg.MustRegister(newSpoolCollector(r.spool, r.s.SpoolPath))
	jobsDir, pluginDir, err := prepareWorkPath(r.s)
	if err != nil {
		return err
	}
	if r.files, err = newFileSource(r.s, r.log); err != nil {
		return err
	}
	if r.files.cache != nil {
		r.reg.MustRegister(newCacheCollector(r.files.cache))
	}
	allow := r.s.JobEnvAllowList()
	r.runner, err = jobs.New(jobs.Config{
		Logger:         r.log.Named("jobs"),
		Recorder:       recorder{r.spool, met},
		Files:          r.files,
		Token:          string(r.s.Token),
		WorkDir:        r.files.workDir(jobsDir),
		PluginDir:      pluginDir,
		MaxJobs:        r.s.MaxJobs, // the one place RTE_MAX_JOBS goes; jobs decides what the app's 0 means
		MaxOutputBytes: r.s.ProcessMaxBuffer,
		Instance:       Hostname(),
		BaseEnv:        jobs.PassEnv(r.opts.Environ, allow),
		EnvAllow:       allow,
		RanLedger:      filepath.Join(r.s.WorkPath, "ran-jobs"),
		Healthy:        r.spool.Healthy,
		Containers:     containers,
	})
	return err
}

// containerConfig is RTE_ENGINE=docker's or podman's part of the settings, nil for process
// groups.
func (r *rte) containerConfig() *jobs.ContainerConfig {
	if r.s.Engine != config.EngineDocker && r.s.Engine != config.EnginePodman {
		return nil
	}
	return &jobs.ContainerConfig{
		Host:        r.s.EngineHost,
		Image:       r.s.Image,
		Allow:       r.s.ImagesAllowList(),
		Podman:      r.s.Engine == config.EnginePodman,
		Pull:        r.s.Pull,
		Network:     r.s.JobNetwork,
		NanoCPUs:    r.s.JobNanoCPUs(),
		MemoryBytes: r.s.JobMemoryBytes(),
		Name:        r.s.Name,
	}
}

// openSessions makes the session Manager, the one owner of the socket to the app.
func (r *rte) openSessions() {
	r.sessions = session.NewManager(session.Config{
		Logger:   r.log,
		Registry: r.reg,
		Jobs:     r.runner,
		Outbox:   r.spool,
		Bundles:  r.files.bundles(),
		Checker:  newChecker(r.opts.Environ, r.log),
		Hello: protocol.Hello{
			Name: r.s.Name, Version: r.opts.Version, Instance: Hostname(), Mode: r.s.Mode, Files: r.s.Files,
			TokenFingerprint: protocol.TokenFingerprint(string(r.s.Token)), AnsibleVersion: ansibleVersion(r.log),
			Images: r.runner.Images(),
		},
		PingInterval: r.s.PingInterval,
		DeadAfter:    r.s.DeadAfter,
	})
	r.files.fetch = r.sessions
	registerSocketState(r.reg, r.sessions)
	r.ready = readiness{outbound: r.s.Mode == protocol.ModeOutbound, spool: r.spool, socket: r.sessions, engine: r.runner.Ready}
}

// ansibleVersion asks ansible-playbook for its version for the hello; an RTE without ansible
// still serves (the app shows the empty version), but says so loudly.
func ansibleVersion(logger *zap.Logger) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := jobs.AnsibleVersion(ctx, jobs.DefaultAnsiblePlaybook)
	if err != nil {
		logger.Error("ansible-playbook is not usable; jobs will fail until it is installed", zap.Error(err))
		return ""
	}
	return v
}

// openServer makes the listener's handler: the socket (inbound only), the probes, /metrics.
func (r *rte) openServer() (err error) {
	cfg := server.Config{
		Token:        string(r.s.Token),
		MetricsToken: string(r.s.MetricsToken),
		Logger:       r.log,
		Registry:     r.reg,
		Version:      r.opts.Version,
		Ready:        r.ready.check,
	}
	if r.s.Mode == protocol.ModeInbound {
		cfg.Sockets = r.sessions
	}
	r.srv, err = server.New(cfg)
	return err
}

// listen is the listener to serve: the one handed over, or a new one on PORT and LISTEN_HOST;
// in TLS when HTTPS=1.
func (r *rte) listen(ln net.Listener) (net.Listener, error) {
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", r.s.ListenAddr()); err != nil {
			return nil, fmt.Errorf("listen on %s (PORT, LISTEN_HOST): %w", r.s.ListenAddr(), err)
		}
	}
	if r.tls != nil {
		ln = tls.NewListener(ln, r.tls)
	}
	return ln, nil
}

// reachApp starts what calls the app, beside serving: outbound, the dialer of the one socket;
// inbound with APP_URL, the registration. It fails only for settings the calls cannot use.
func (r *rte) reachApp(ctx context.Context, wg *sync.WaitGroup, errs chan<- error) error {
	switch {
	case r.s.Mode == protocol.ModeOutbound:
		dialer, err := appDialer(r.s, r.log)
		if err != nil {
			return err
		}
		wg.Add(1)
		// Run returns an error only for settings it cannot work with, at once; that stops the RTE.
		go func() { defer wg.Done(); errs <- dialer.Run(ctx, r.sessions) }()
	case r.s.Mode == protocol.ModeInbound && r.s.AppURL != "":
		client, err := appHTTPClient(r.s, r.log)
		if err != nil {
			return err
		}
		req := protocol.RegisterRequest{
			Name: r.s.Name, URL: r.s.RTEURL, Token: string(r.s.Token), JoinToken: string(r.s.JoinToken),
			Version: r.opts.Version, MaxJobs: r.runner.DefaultMaxJobs(),
		}
		if r.identity != nil {
			req.Certificate = string(r.identity.PEM)
		}
		reg := &pinning.Registrar{
			Client: client, AppURL: r.s.AppURL, Request: req,
			Logger: r.log.Named("register"), OnState: r.srv.SetRegistrationState,
		}
		wg.Add(1)
		// Serving never waits for the registration, and a refusal only logs: Run logs every
		// answer itself, and the RTE keeps serving either way.
		go func() { defer wg.Done(); _ = reg.Run(ctx) }()
	}
	return nil
}

// waitStopped waits for the goroutines run started, at most the shutdown limit; a second
// signal ends the wait at once.
func (r *rte) waitStopped(wg *sync.WaitGroup, sigs <-chan os.Signal) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case sig := <-sigs:
		r.log.Warn("second signal: exiting at once", zap.String("signal", sig.String()))
	case <-time.After(r.opts.ShutdownLimit):
		r.log.Error(fmt.Sprintf("shutdown took longer than %s; exiting", r.opts.ShutdownLimit))
	}
}
