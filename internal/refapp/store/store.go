package store

import (
	"context"
	"fmt"
	"net/url"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/pgstore"
	"github.com/rte-project/rte/app/sqlitestore"
)

// Open opens the store APP_DB names: a PostgreSQL database for a postgres:// or
// postgresql:// URL (app nodes on several hosts share it), else an SQLite file, the default
// (nodes on one host only). close closes it.
func Open(ctx context.Context, db string) (store app.Store, close func(), err error) {
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

// ForLog is APP_DB as it may be logged: a URL without its password.
func ForLog(db string) string {
	if !pgstore.IsURL(db) {
		return db
	}
	u, err := url.Parse(db)
	if err != nil {
		return "postgres://[does not parse]"
	}
	return u.Redacted()
}
