package e2e

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
)

// appSide is the real app half (package app) as every test here stands it up: one helper,
// with options for the store, the config, the listener and the Run loop, instead of a copy in
// each test file. The reference app as a process is refApp (check_test.go).
type appSide struct {
	*app.App
	Store  app.Store
	Config app.Config // as the App was made
	DBPath string     // the SQLite file; empty on the memory store
	URL    string     // where a.Handler() is served; empty unless served
	srv    *httptest.Server
	cancel context.CancelFunc
	done   chan struct{}
}

type appSideOptions struct {
	sqlite bool
	dbPath string
	base   *app.Config
	edits  []func(*app.Config)
	serve  bool
	run    bool
}

type appOption func(*appSideOptions)

// onSQLite puts the app on the SQLite file at path (a new one when empty) instead of the
// memory store; another node given the same path shares the store, as a second rte-app does.
func onSQLite(path string) appOption {
	return func(o *appSideOptions) { o.sqlite, o.dbPath = true, path }
}

// fromConfig starts from another node's config instead of the default (store and edits still
// apply on top).
func fromConfig(cfg app.Config) appOption { return func(o *appSideOptions) { o.base = &cfg } }

// withAppConfig changes the config before the App is made.
func withAppConfig(edits ...func(*app.Config)) appOption {
	return func(o *appSideOptions) { o.edits = append(o.edits, edits...) }
}

// served serves the App's handler on a real loopback listener (URL) until the test ends.
func served() appOption { return func(o *appSideOptions) { o.serve = true } }

// running runs the App's Run loop (dialling, dispatch) until Stop or the test's end.
func running() appOption { return func(o *appSideOptions) { o.run = true } }

// startAppSide makes the app half. The default is node app-1 on the memory store, logging to
// the test, neither served nor running.
func startAppSide(t testing.TB, opts ...appOption) *appSide {
	t.Helper()
	var o appSideOptions
	for _, opt := range opts {
		opt(&o)
	}
	cfg := app.Config{Logger: zaptest.NewLogger(t), Node: "app-1"}
	if o.base != nil {
		cfg = *o.base
	}
	s := &appSide{done: make(chan struct{})}
	if o.sqlite {
		s.DBPath = o.dbPath
		if s.DBPath == "" {
			s.DBPath = filepath.Join(t.TempDir(), "app.db")
		}
		store, err := sqlitestore.Open(s.DBPath)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		cfg.Store = store
	} else {
		cfg.Store = app.NewMemoryStore()
	}
	for _, edit := range o.edits {
		edit(&cfg)
	}
	a, err := app.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.App, s.Store, s.Config = a, cfg.Store, cfg
	if o.serve {
		s.srv = httptest.NewServer(a.Handler())
		t.Cleanup(s.srv.Close)
		s.URL = s.srv.URL
	}
	if o.run {
		s.Start(t)
	}
	return s
}

// Start runs the App's Run loop until Stop or the test's end, for a test that must start it
// after something else (the RTE it dials).
func (s *appSide) Start(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { defer close(s.done); _ = s.App.Run(ctx) }()
	t.Cleanup(s.Stop)
}

// Stop ends the Run loop, which closes the App's sockets and frees its leases, and waits for
// it. Safe to call twice, and without a Run loop.
func (s *appSide) Stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
}
