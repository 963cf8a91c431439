package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/rte-project/rte/internal/logging"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
)

// HTTP server limits. Variables so a test can shorten them.
var (
	// readHeaderTimeout stops a client that opens a connection and sends nothing.
	readHeaderTimeout = 10 * time.Second
	// readTimeout bounds reading a whole request; bodies are small (a job is at most 4 MiB).
	// A stream clears it once its request is read, or the server would cancel the stream.
	readTimeout = time.Minute
	// writeTimeout bounds writing an answer; a stream moves it forward at every write.
	writeTimeout = time.Minute
	// idleTimeout closes keep-alive connections nobody uses.
	idleTimeout = 2 * time.Minute
	// shutdownTimeout bounds the wait for requests in flight when the app stops.
	shutdownTimeout = 10 * time.Second
)

// maxHeaderBytes is far above a real request's headers (a token and a few standard ones).
const maxHeaderBytes = 64 << 10

func serve(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	if err := noArgs(newFlagSet("serve", stdout, stderr), args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage // noArgs printed why and the usage
	}
	s, err := loadSettings(environ, hostname())
	if err != nil {
		var se *settingsError
		if errors.As(err, &se) {
			fmt.Fprintf(stderr, "rte-app serve: the settings have %d problem(s); nothing was started:\n", len(se.problems))
			for _, p := range se.problems {
				fmt.Fprintf(stderr, "  - %s\n", p)
			}
		} else {
			fmt.Fprintf(stderr, "rte-app serve: %v\n", err)
		}
		return exitUsage
	}
	logger, err := logging.New(s.LogLevel, s.LogFormat, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "rte-app serve: logger: %v\n", err)
		return exitUsage
	}
	defer func() { _ = logger.Sync() }()
	if err := serveSettings(ctx, s, logger); err != nil {
		logger.Error("rte-app stopped", zap.Error(err))
		return exitTrouble
	}
	logger.Info("rte-app stopped")
	return exitOK
}

// startMessage is the start log line's message.
const startMessage = "rte-app starting: the reference app (demo, test peer, example for app authors), not a product"

func serveSettings(ctx context.Context, s *settings, logger *zap.Logger) error {
	store, closeStore, err := openStore(ctx, s.DB)
	if err != nil {
		return err
	}
	defer closeStore()
	files, err := newBundleSource(s, logger)
	if err != nil {
		return err
	}
	a, err := app.New(app.Config{
		Store:        store,
		Logger:       logger,
		Node:         s.Node,
		JoinToken:    string(s.JoinToken),
		QueueTimeout: s.QueueTimeout(),
		Files:        files.filesConfig(),
		SecretKey:    string(s.SecretKey),
		Seed:         s.seedSource(),
	})
	if err != nil {
		return err
	}
	if err := a.ApplySeed(ctx); err != nil {
		return fmt.Errorf("apply the config seed (APP_SEED): %w", err)
	}
	ln, err := net.Listen("tcp", s.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s (APP_LISTEN): %w", s.Listen, err)
	}
	// The first line an operator reads says what this program is: the multi-node guide runs it
	// too, and it must not pass for the product.
	logger.Info(startMessage,
		zap.String("listen", ln.Addr().String()),
		zap.String("db", dbForLog(s.DB)),
		zap.String("node", s.Node),
		zap.Bool("join_token", s.JoinToken != ""),
		zap.Duration("queue_timeout", s.QueueTimeout()),
		zap.String("playbooks", s.PlaybooksPath), zap.String("inventory", s.InventoryPath),
		zap.Int("files_max_mb", s.FilesMaxMB),
		zap.String("seed", s.Seed), zap.Bool("secret_key", s.SecretKey != ""))
	return serveApp(ctx, a, ln, string(s.AdminToken), logger)
}

// serveApp runs the app's dispatch (a.Run) and its HTTP server on ln until ctx ends or
// either fails, then stops both and waits for them. Open streams end at once; other requests
// get shutdownTimeout to finish.
func serveApp(ctx context.Context, a *app.App, ln net.Listener, adminToken string, logger *zap.Logger) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	closing := make(chan struct{})
	srv := &http.Server{
		Handler:           newHandler(a, adminToken, logger.Named("http"), closing),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          zap.NewStdLog(logger.Named("http")),
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer cancel()
		if err := a.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			errs <- fmt.Errorf("dispatch: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		defer cancel()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("http server: %w", err)
		}
	}()
	<-runCtx.Done()
	close(closing)
	shutCtx, done := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer done()
	if err := srv.Shutdown(shutCtx); err != nil {
		logger.Warn("http server did not stop in time; closing its connections", zap.Duration("timeout", shutdownTimeout))
		_ = srv.Close()
	}
	wg.Wait()
	close(errs)
	return errors.Join(collect(errs)...)
}

func collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}
