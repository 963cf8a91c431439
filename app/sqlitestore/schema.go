package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/rte-project/rte/app/internal/sqlrows"
)

// migrations[i] takes the schema from version i to version i+1. Append only: a released
// migration never changes, since files out there have already run it.
//
// Times are TEXT in one fixed-width UTC layout (sqlrows.TimeLayout), so they sort as text, hold any
// time a JSON record can carry, and read back exactly; "" is the zero time.
var migrations = [][]string{
	{ // 1: runners, jobs, records
		`CREATE TABLE runners (
			name                TEXT PRIMARY KEY,
			url                 TEXT NOT NULL,
			mode                TEXT NOT NULL,
			files               TEXT NOT NULL,
			state               TEXT NOT NULL,
			token               TEXT NOT NULL,
			token_fingerprint   TEXT NOT NULL,
			certificate         BLOB,
			pending_certificate BLOB,
			certificate_sha256  TEXT NOT NULL,
			version             TEXT NOT NULL,
			max_jobs            INTEGER NOT NULL,
			remote_addr         TEXT NOT NULL,
			requested_at        TEXT NOT NULL,
			approved_at         TEXT NOT NULL,
			last_seen           TEXT NOT NULL
		)`,
		// A job keeps its runner's name, not a foreign key: the history of a removed runner's
		// jobs stays readable.
		`CREATE TABLE jobs (
			id               TEXT PRIMARY KEY,
			runner           TEXT NOT NULL,
			start            TEXT NOT NULL,
			secret_names     TEXT NOT NULL,
			state            TEXT NOT NULL,
			cancel_requested INTEGER NOT NULL,
			status           TEXT NOT NULL,
			exit_code        INTEGER NOT NULL,
			message          TEXT NOT NULL,
			created_at       TEXT NOT NULL,
			dispatched_at    TEXT NOT NULL,
			started_at       TEXT NOT NULL,
			ended_at         TEXT NOT NULL,
			last_seq         INTEGER NOT NULL DEFAULT 0
		)`,
		`CREATE INDEX jobs_by_created ON jobs (created_at DESC, id DESC)`,
		`CREATE INDEX jobs_by_state ON jobs (state, created_at DESC, id DESC)`,
		`CREATE INDEX jobs_by_runner ON jobs (runner, state, created_at DESC, id DESC)`,
		// A rowid table, not WITHOUT ROWID: rows carry up to megabytes of data, and a
		// WITHOUT ROWID b-tree holds whole rows in its index pages.
		`CREATE TABLE records (
			job  TEXT NOT NULL,
			seq  INTEGER NOT NULL,
			kind TEXT NOT NULL,
			at   TEXT NOT NULL,
			data BLOB NOT NULL,
			PRIMARY KEY (job, seq)
		)`,
	},
	{ // 2: several app nodes (leases, secrets sealed at rest), the config seed
		`ALTER TABLE runners ADD COLUMN seeded INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE jobs ADD COLUMN submit_node TEXT NOT NULL DEFAULT ''`,
		// JSON of name -> value sealed with the app's secret key; '' when there are none.
		`ALTER TABLE jobs ADD COLUMN sealed_secrets TEXT NOT NULL DEFAULT ''`,
		// One row per runner that ever had a lease or a wake; a free lease has instance ''.
		`CREATE TABLE leases (
			runner    TEXT PRIMARY KEY,
			node      TEXT NOT NULL,
			instance  TEXT NOT NULL,
			expires   TEXT NOT NULL,
			connected INTEGER NOT NULL,
			wake      INTEGER NOT NULL
		)`,
	},
	{ // 3: the job images a runner allows, from its hello (Runner.Images, sqlrows.JoinImages)
		`ALTER TABLE runners ADD COLUMN images TEXT NOT NULL DEFAULT ''`,
	},
}

// migrate brings the file's schema to the last of migrations in one write transaction, so two
// processes opening a new file at once cannot both create it.
func (s *Store) migrate(ctx context.Context) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	changed, err := sqlrows.Migrate(ctx, migrateTx{tx}, migrations, `UPDATE schema_version SET version = ?`, func(have, known int) error {
		return fmt.Errorf("the file's schema is version %d and this build knows up to %d: run a newer rte-app on it, or restore the file this build wrote", have, known)
	})
	if err != nil || !changed {
		return err
	}
	return tx.Commit()
}

// migrateTx is a database/sql transaction as sqlrows.Migrate uses it.
type migrateTx struct{ tx *sql.Tx }

func (t migrateTx) Exec(ctx context.Context, stmt string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, stmt, args...)
	return err
}

func (t migrateTx) Version(ctx context.Context) (int, bool, error) {
	var v int
	err := t.tx.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return v, err == nil, err
}
