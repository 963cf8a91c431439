package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/rte-project/rte/app/internal/sqlrows"
)

// migrations[i] takes the schema from version i to version i+1. Append only: a released
// migration never changes, since databases out there have already run it.
var migrations = [][]string{
	{ // 1: runners, jobs, records, leases
		`CREATE TABLE runners (
			name                TEXT COLLATE "C" PRIMARY KEY,
			url                 TEXT NOT NULL,
			mode                TEXT NOT NULL,
			files               TEXT NOT NULL,
			state               TEXT NOT NULL,
			token               TEXT NOT NULL,
			token_fingerprint   TEXT NOT NULL,
			certificate         BYTEA,
			pending_certificate BYTEA,
			certificate_sha256  TEXT NOT NULL,
			version             TEXT NOT NULL,
			max_jobs            INTEGER NOT NULL,
			remote_addr         TEXT NOT NULL,
			requested_at        TEXT NOT NULL,
			approved_at         TEXT NOT NULL,
			last_seen           TEXT NOT NULL,
			seeded              BOOLEAN NOT NULL
		)`,
		// A job keeps its runner's name, not a foreign key: the history of a removed runner's
		// jobs stays readable. start is json, not jsonb, which would rewrite the extravars an
		// app author gave. sealed_secrets is NULL when there are none.
		`CREATE TABLE jobs (
			id               TEXT COLLATE "C" PRIMARY KEY,
			runner           TEXT COLLATE "C" NOT NULL,
			start            JSON NOT NULL,
			secret_names     TEXT[] NOT NULL,
			state            TEXT COLLATE "C" NOT NULL,
			cancel_requested BOOLEAN NOT NULL,
			status           TEXT NOT NULL,
			exit_code        INTEGER NOT NULL,
			message          TEXT NOT NULL,
			created_at       TEXT COLLATE "C" NOT NULL,
			dispatched_at    TEXT NOT NULL,
			started_at       TEXT NOT NULL,
			ended_at         TEXT NOT NULL,
			submit_node      TEXT NOT NULL,
			sealed_secrets   JSONB,
			last_seq         BIGINT NOT NULL DEFAULT 0
		)`,
		`CREATE INDEX jobs_by_created ON jobs (created_at DESC, id DESC)`,
		`CREATE INDEX jobs_by_state ON jobs (state, created_at DESC, id DESC)`,
		`CREATE INDEX jobs_by_runner ON jobs (runner, state, created_at DESC, id DESC)`,
		// No foreign key to jobs: StoreRecords checks the jobs under a row lock already, and a
		// key would cost a lookup per record.
		`CREATE TABLE records (
			job  TEXT COLLATE "C" NOT NULL,
			seq  BIGINT NOT NULL,
			kind TEXT NOT NULL,
			at   TEXT NOT NULL,
			data BYTEA NOT NULL,
			PRIMARY KEY (job, seq)
		)`,
		// Output is text that compresses well, and PostgreSQL compresses a value over 2 KiB:
		// lz4, where the server has it, took a third of the time of the default pglz for 64 KiB
		// records (BenchmarkStoreRecords).
		`DO $$ BEGIN
			IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
				ALTER TABLE records ALTER COLUMN data SET COMPRESSION lz4;
			END IF;
		END $$`,
		// One row per runner that ever had a lease or a wake; a free lease has instance ''.
		`CREATE TABLE leases (
			runner    TEXT COLLATE "C" PRIMARY KEY,
			node      TEXT NOT NULL,
			instance  TEXT NOT NULL,
			expires   TEXT COLLATE "C" NOT NULL,
			connected BOOLEAN NOT NULL,
			wake      BIGINT NOT NULL
		)`,
	},
	{ // 2: the job images a runner allows, from its hello (Runner.Images, sqlrows.JoinImages)
		`ALTER TABLE runners ADD COLUMN images TEXT NOT NULL DEFAULT ''`,
	},
}

// migrateLock is the key of the advisory lock held while the schema is read and migrated, so
// that nodes starting at once migrate one after another ("rte-app" in ASCII).
const migrateLock = 0x7274652d617070

// migrate brings the database's schema to the last of migrations in one transaction.
func (s *Store) migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
			return err
		}
		_, err := sqlrows.Migrate(ctx, migrateTx{tx}, migrations, `UPDATE schema_version SET version = $1`, func(have, known int) error {
			return fmt.Errorf("the database's schema is version %d and this build knows up to %d: run a newer rte-app on it, or give this one another database", have, known)
		})
		return err
	})
}

// migrateTx is a pgx transaction as sqlrows.Migrate uses it.
type migrateTx struct{ tx pgx.Tx }

func (t migrateTx) Exec(ctx context.Context, stmt string, args ...any) error {
	_, err := t.tx.Exec(ctx, stmt, args...)
	return err
}

func (t migrateTx) Version(ctx context.Context) (int, bool, error) {
	var v int
	err := t.tx.QueryRow(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return v, err == nil, err
}
