package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/settings"
	"github.com/rte-project/rte/internal/refapp/store"
	"github.com/rte-project/rte/internal/refapp/web"
)

// HTTP server limits. Variables so a test can shorten them.
var (
	// readHeaderTimeout stops a client that opens a connection and sends nothing.
	readHeaderTimeout = 10 * time.Second
	// ReadTimeout bounds reading a whole request; bodies are small (a job is at most 4 MiB).
	// A stream clears it once its request is read, or the server would cancel the stream.
	ReadTimeout = time.Minute
	// writeTimeout bounds writing an answer; a stream moves it forward at every write.
	writeTimeout = time.Minute
	// idleTimeout closes keep-alive connections nobody uses.
	idleTimeout = 2 * time.Minute
	// shutdownTimeout bounds the wait for requests in flight when the app stops.
	shutdownTimeout = 10 * time.Second
)

// maxHeaderBytes is far above a real request's headers (a token and a few standard ones).
const maxHeaderBytes = 64 << 10

// StartMessage is the start log line's message; tests wait for it.
const StartMessage = "rte-app starting: the reference app (demo, test peer, example for app authors), not a product"

// Run is `rte-app serve` once its settings are checked and its logger built: it opens the
// store, applies the config seed, listens on APP_LISTEN and serves until ctx ends.
func Run(ctx context.Context, s *settings.Settings, logger *zap.Logger) error {
	st, closeStore, err := store.Open(ctx, s.DB)
	if err != nil {
		return err
	}
	defer closeStore()
	files, err := NewBundleSource(s, logger)
	if err != nil {
		return err
	}
	a, err := app.New(app.Config{
		Store:        st,
		Logger:       logger,
		Node:         s.Node,
		JoinToken:    string(s.JoinToken),
		QueueTimeout: s.QueueTimeout(),
		Files:        files.FilesConfig(),
		SecretKey:    string(s.SecretKey),
		Seed:         s.SeedSource(),
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
	logger.Info(StartMessage,
		zap.String("listen", ln.Addr().String()),
		zap.String("db", store.ForLog(s.DB)),
		zap.String("node", s.Node),
		zap.Bool("join_token", s.JoinToken != ""),
		zap.Duration("queue_timeout", s.QueueTimeout()),
		zap.String("playbooks", s.PlaybooksPath), zap.String("inventory", s.InventoryPath),
		zap.Int("files_max_mb", s.FilesMaxMB),
		zap.String("seed", s.Seed), zap.Bool("secret_key", s.SecretKey != ""))
	return Serve(ctx, a, ln, string(s.AdminToken), logger)
}

// Serve runs the app's dispatch (a.Run) and its HTTP server on ln until ctx ends or
// either fails, then stops both and waits for them. Open streams end at once; other requests
// get shutdownTimeout to finish.
func Serve(ctx context.Context, a *app.App, ln net.Listener, adminToken string, logger *zap.Logger) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	closing := make(chan struct{})
	srv := &http.Server{
		Handler:           Handler(a, adminToken, logger.Named("http"), closing),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       ReadTimeout,
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

// Handler returns the reference app's whole HTTP surface: the protocol's registration
// endpoint (unauthenticated by design: it only records requests for an admin), readiness, the
// admin API behind APP_ADMIN_TOKEN under /api/, and the admin page everywhere else. closing
// ends the open streams when it is closed.
func Handler(a *app.App, adminToken string, logger *zap.Logger, closing <-chan struct{}) http.Handler {
	h := api.New(a, adminToken, logger, closing)
	mux := http.NewServeMux()
	mux.Handle("/api/v2/rte/", a.Handler())
	mux.HandleFunc("GET /ready", ready(a)) // ready.go
	mux.Handle("/api/", h.Handler())
	// Everything else is the admin page, signed in with the same token (package web).
	mux.Handle("/", web.New(h))
	return h.LogRequests(mux)
}

func collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}
