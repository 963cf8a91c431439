package sqlrows

import (
	"context"
	"fmt"
)

// MigrateTx is what Migrate needs of one open transaction, in either dialect.
type MigrateTx interface {
	Exec(ctx context.Context, stmt string, args ...any) error
	// Version reads the one row of schema_version; ok is false when the table has none.
	Version(ctx context.Context) (v int, ok bool, err error)
}

// Migrate brings a schema to version len(migrations) inside tx: migrations[i] takes it from
// version i to i+1. It makes the schema_version table of a new database, refuses a schema newer
// than this build with tooNew(have, known), runs each missing step's statements in order and
// records the new version with setVersion (the dialect's "UPDATE schema_version SET version =
// <placeholder>"). changed reports whether it wrote anything the caller must commit; taking a
// lock against other processes migrating at once, and committing, are the caller's.
func Migrate(ctx context.Context, tx MigrateTx, migrations [][]string, setVersion string, tooNew func(have, known int) error) (changed bool, err error) {
	known := len(migrations)
	if err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return false, err
	}
	v, ok, err := tx.Version(ctx)
	if err == nil && !ok {
		v = 0
		err = tx.Exec(ctx, `INSERT INTO schema_version (version) VALUES (0)`)
	}
	if err != nil {
		return false, fmt.Errorf("read schema version: %w", err)
	}
	if v > known {
		return false, tooNew(v, known)
	}
	if v == known {
		return !ok, nil
	}
	for i := v; i < known; i++ {
		for _, stmt := range migrations[i] {
			if err := tx.Exec(ctx, stmt); err != nil {
				return false, fmt.Errorf("migrate schema to version %d: %w", i+1, err)
			}
		}
	}
	if err := tx.Exec(ctx, setVersion, known); err != nil {
		return false, err
	}
	return true, nil
}
