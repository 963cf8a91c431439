package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/pgstore"
	"github.com/rte-project/rte/app/sqlitestore"
)

// openStore opens the store APP_DB names: a PostgreSQL database for a postgres:// or
// postgresql:// URL (app nodes on several hosts share it), else an SQLite file, the default
// (nodes on one host only). close closes it.
func openStore(ctx context.Context, db string) (store app.Store, close func(), err error) {
	if pgstore.IsURL(db) {
		s, err := pgstore.Open(ctx, db)
		if err != nil {
			return nil, nil, fmt.Errorf("open the database (APP_DB, PostgreSQL): %w", err)
		}
		return s, s.Close, nil
	}
	s, err := sqlitestore.Open(db)
	if err != nil {
		return nil, nil, fmt.Errorf("open the database (APP_DB): %w", err)
	}
	return s, func() { _ = s.Close() }, nil
}

// dbForLog is APP_DB as it may be logged: a URL without its password.
func dbForLog(db string) string {
	if !pgstore.IsURL(db) {
		return db
	}
	u, err := url.Parse(db)
	if err != nil {
		return "postgres://[does not parse]"
	}
	return u.Redacted()
}

// ready answers GET /ready, for load balancers and orchestrators: 200 while the node reads and
// claims the runners' leases in its store, 503 saying why while it cannot, when it gives up the
// runners it cannot renew (docs/app-nodes.md). It needs no token, so it says no more than that
// the store fails and the store's error, which names the database server but never a password.
func ready(a *app.App) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := a.StoreTrouble(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: the store fails, so this node gives up the runners whose leases it cannot renew: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ready")
	}
}
