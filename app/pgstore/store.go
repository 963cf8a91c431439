package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/internal/sqlrows"
	"github.com/rte-project/rte/protocol"
)

// Defaults of the pool, used when the URL does not set them.
const (
	// DefaultMaxConns bounds the connections one Store opens (pool_max_conns). An app node's
	// calls are short and most are the lease poll and record batches; ten leave room for many
	// sockets' batches at once while several nodes stay far below the server's usual
	// max_connections of 100.
	DefaultMaxConns = 10
	// DefaultConnectTimeout bounds dialling and authenticating one connection (connect_timeout):
	// a server that does not answer within it is down or cut off.
	DefaultConnectTimeout = 5 * time.Second
)

// CallTimeout bounds every call of the Store, waiting for a pooled connection included, when
// the caller's context has no earlier deadline. A record batch or a lease claim takes
// milliseconds; a call that takes this long has a server that went away, and failing it lets the
// app give up the leases it can no longer renew instead of waiting on a dead TCP connection.
const CallTimeout = 15 * time.Second

// Store is an app.Store on one PostgreSQL database. It is safe for concurrent use, and any
// number of processes on any hosts may share the database.
type Store struct {
	pool *pgxpool.Pool
	// server names the server for errors: host:port/database, never the password.
	server string
}

var _ app.Store = (*Store)(nil)

// IsURL reports whether db names a PostgreSQL database (a postgres:// or postgresql:// URL)
// rather than a file: what the reference app's APP_DB tells apart.
func IsURL(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// Open connects to the database that url names (postgres://user:password@host:port/db?...,
// or the key=value form; libpq's PG* environment variables fill in what it leaves out), checks
// that the server answers, and creates or migrates the schema. The pool is bounded by
// pool_max_conns, else DefaultMaxConns; a connection attempt by connect_timeout, else
// DefaultConnectTimeout.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// Only the reason: pgconn quotes the URL too, with the password masked on a best-effort
		// basis only.
		why := err.Error()
		if i := strings.LastIndex(why, "`: "); i >= 0 {
			why = why[i+3:]
		}
		return nil, fmt.Errorf("open store: the PostgreSQL URL does not parse (%s); give one such as postgres://rte:PASSWORD@db.example.com:5432/rte", why)
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "rte-app"
	}
	s := &Store{server: fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)}
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		s.server = fmt.Sprintf("%s/.s.PGSQL.%d (%s)", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	}
	s.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open store on %s: %w", s.server, err)
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		s.pool.Close()
		return nil, s.fail("open store", err)
	}
	if err := s.migrate(ctx); err != nil {
		s.pool.Close()
		return nil, s.fail("open store: schema", err)
	}
	return s, nil
}

// Close closes every pooled connection, waiting for those in use to be returned. Calls after
// Close fail.
func (s *Store) Close() { s.pool.Close() }

// call bounds one call by CallTimeout.
func call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, CallTimeout)
}

// fail wraps err for op. When the server cannot be reached (refused, timed out, connection
// lost), the error says so and names the server, so the log and /ready point at the database
// rather than at rte.
func (s *Store) fail(op string, err error) error {
	var ce *pgconn.ConnectError
	var ne net.Error
	switch {
	case errors.As(err, &ce), errors.As(err, &ne), pgconn.Timeout(err), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%s: the PostgreSQL server at %s does not answer (%w): check that it runs and that this host reaches it", op, s.server, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// ---- runners

func scanRunner(row pgx.Row) (*app.Runner, error) {
	var r app.Runner
	var state, images string
	var times [3]string
	if err := row.Scan(&r.Name, &r.URL, &r.Mode, &r.Files, &state, &r.Token, &r.TokenFingerprint,
		&r.Certificate, &r.PendingCertificate, &r.CertificateSHA256, &r.Version, &r.MaxJobs,
		&r.RemoteAddr, &times[0], &times[1], &times[2], &r.Seeded, &images); err != nil {
		return nil, err
	}
	r.Images = sqlrows.SplitImages(images)
	r.State = app.State(state)
	for i, dst := range []*time.Time{&r.RequestedAt, &r.ApprovedAt, &r.LastSeen} {
		t, err := sqlrows.ParseTime(times[i])
		if err != nil {
			return nil, fmt.Errorf("runner %q: stored time does not parse: %w", r.Name, err)
		}
		*dst = t
	}
	return &r, nil
}

func (s *Store) GetRunner(ctx context.Context, name string) (*app.Runner, error) {
	ctx, cancel := call(ctx)
	defer cancel()
	r, err := scanRunner(s.pool.QueryRow(ctx, `SELECT `+sqlrows.RunnerColumns+` FROM runners WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, sqlrows.NotFound("runner", name)
	}
	if err != nil {
		return nil, s.fail(fmt.Sprintf("get runner %q", name), err)
	}
	return r, nil
}

func (s *Store) PutRunner(ctx context.Context, r *app.Runner) error {
	if r == nil || r.Name == "" {
		return errors.New("put runner: the runner has no name")
	}
	ctx, cancel := call(ctx)
	defer cancel()
	_, err := s.pool.Exec(ctx, `INSERT INTO runners (`+sqlrows.RunnerColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18) `+sqlrows.RunnerUpsert,
		r.Name, r.URL, r.Mode, r.Files, string(r.State), r.Token, r.TokenFingerprint,
		r.Certificate, r.PendingCertificate, r.CertificateSHA256, r.Version, r.MaxJobs,
		r.RemoteAddr, sqlrows.FormatTime(r.RequestedAt), sqlrows.FormatTime(r.ApprovedAt), sqlrows.FormatTime(r.LastSeen), r.Seeded, sqlrows.JoinImages(r.Images))
	if err != nil {
		return s.fail(fmt.Sprintf("put runner %q", r.Name), err)
	}
	return nil
}

func (s *Store) DeleteRunner(ctx context.Context, name string) error {
	ctx, cancel := call(ctx)
	defer cancel()
	tag, err := s.pool.Exec(ctx, `DELETE FROM runners WHERE name = $1`, name)
	if err != nil {
		return s.fail(fmt.Sprintf("delete runner %q", name), err)
	}
	if tag.RowsAffected() == 0 {
		return sqlrows.NotFound("runner", name)
	}
	return nil
}

func (s *Store) ListRunners(ctx context.Context) ([]*app.Runner, error) {
	ctx, cancel := call(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT `+sqlrows.RunnerColumns+` FROM runners ORDER BY name`)
	if err != nil {
		return nil, s.fail("list runners", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*app.Runner, error) { return scanRunner(row) })
	if err != nil {
		return nil, s.fail("list runners", err)
	}
	return out, nil
}

// ---- jobs

// jobArgs are the values of every job column but last_seq, in sqlrows.JobColumns' order, as $1..$15.
// The secrets in clear are never stored, and sealed ones only while the job is queued or
// dispatched (app.Store.UpdateJob).
func jobArgs(j *app.Job) ([]any, error) {
	start := j.Start
	start.Secrets = nil
	startJSON, err := json.Marshal(start)
	if err != nil {
		return nil, fmt.Errorf("job %q: encode start: %w", j.ID, err)
	}
	names := j.SecretNames
	if names == nil {
		names = []string{}
	}
	var sealed map[string]string // NULL
	if len(j.SealedSecrets) > 0 && (j.State == app.JobQueued || j.State == app.JobDispatched) {
		sealed = j.SealedSecrets
	}
	return []any{j.ID, j.Runner, string(startJSON), names, string(j.State), j.CancelRequested,
		j.Status, j.ExitCode, j.Message, sqlrows.FormatTime(j.CreatedAt), sqlrows.FormatTime(j.DispatchedAt),
		sqlrows.FormatTime(j.StartedAt), sqlrows.FormatTime(j.EndedAt), j.SubmitNode, sealed}, nil
}

func scanJob(row pgx.Row) (*app.Job, error) {
	var j app.Job
	var start, state string
	var times [4]string
	if err := row.Scan(&j.ID, &j.Runner, &start, &j.SecretNames, &state, &j.CancelRequested, &j.Status,
		&j.ExitCode, &j.Message, &times[0], &times[1], &times[2], &times[3], &j.SubmitNode,
		&j.SealedSecrets, &j.LastSeq); err != nil {
		return nil, err
	}
	j.State = app.JobState(state)
	if err := json.Unmarshal([]byte(start), &j.Start); err != nil {
		return nil, fmt.Errorf("job %q: stored start does not decode: %w", j.ID, err)
	}
	if len(j.SecretNames) == 0 {
		j.SecretNames = nil
	}
	if len(j.SealedSecrets) == 0 {
		j.SealedSecrets = nil
	}
	for i, dst := range []*time.Time{&j.CreatedAt, &j.DispatchedAt, &j.StartedAt, &j.EndedAt} {
		t, err := sqlrows.ParseTime(times[i])
		if err != nil {
			return nil, fmt.Errorf("job %q: stored time does not parse: %w", j.ID, err)
		}
		*dst = t
	}
	return &j, nil
}

func (s *Store) CreateJob(ctx context.Context, j *app.Job) error {
	if j == nil || j.ID == "" {
		return errors.New("create job: the job has no id")
	}
	args, err := jobArgs(j)
	if err != nil {
		return fmt.Errorf("create job: %w", err)
	}
	ctx, cancel := call(ctx)
	defer cancel()
	tag, err := s.pool.Exec(ctx, `INSERT INTO jobs (`+sqlrows.JobColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, 0)
		ON CONFLICT (id) DO NOTHING`, args...)
	if err != nil {
		return s.fail(fmt.Sprintf("create job %q", j.ID), err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("job %q: %w", j.ID, app.ErrExists)
	}
	return nil
}

func (s *Store) GetJob(ctx context.Context, id string) (*app.Job, error) {
	ctx, cancel := call(ctx)
	defer cancel()
	j, err := scanJob(s.pool.QueryRow(ctx, `SELECT `+sqlrows.JobColumns+` FROM jobs WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, sqlrows.NotFound("job", id)
	}
	if err != nil {
		return nil, s.fail(fmt.Sprintf("get job %q", id), err)
	}
	return j, nil
}

func (s *Store) UpdateJob(ctx context.Context, j *app.Job) error {
	if j == nil {
		return errors.New("update job: no job given")
	}
	args, err := jobArgs(j)
	if err != nil {
		return fmt.Errorf("update job: %w", err)
	}
	ctx, cancel := call(ctx)
	defer cancel()
	// last_seq is left out: only StoreRecords moves it. An ended job is not touched, and a
	// requested cancel stays requested (app.Store.UpdateJob), so an app node working from an
	// older read cannot undo what another node stored since. The row is locked by the UPDATE,
	// so the check and the write are one step.
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET runner = $2, start = $3, secret_names = $4,
		state = $5, cancel_requested = jobs.cancel_requested OR $6, status = $7, exit_code = $8,
		message = $9, created_at = $10, dispatched_at = $11, started_at = $12, ended_at = $13,
		submit_node = $14, sealed_secrets = $15 WHERE id = $1 AND state <> 'ended'`, args...)
	if err != nil {
		return s.fail(fmt.Sprintf("update job %q", j.ID), err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	var state string
	err = s.pool.QueryRow(ctx, `SELECT state FROM jobs WHERE id = $1`, j.ID).Scan(&state)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return sqlrows.NotFound("job", j.ID)
	case err != nil:
		return s.fail(fmt.Sprintf("update job %q", j.ID), err)
	}
	return fmt.Errorf("update job %q: %w", j.ID, app.ErrJobEnded)
}

func (s *Store) ListJobs(ctx context.Context, f app.JobFilter) ([]*app.Job, error) {
	var where []string
	var args []any
	if f.Runner != "" {
		args = append(args, f.Runner)
		where = append(where, fmt.Sprintf("runner = $%d", len(args)))
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		args = append(args, states)
		where = append(where, fmt.Sprintf("state = ANY($%d)", len(args)))
	}
	q := `SELECT ` + sqlrows.JobColumns + ` FROM jobs`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at DESC, id DESC"
	if f.Limit > 0 {
		args = append(args, f.Limit)
		q += fmt.Sprintf(" LIMIT $%d", len(args))
	}
	ctx, cancel := call(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, s.fail("list jobs", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*app.Job, error) { return scanJob(row) })
	if err != nil {
		return nil, s.fail("list jobs", err)
	}
	return out, nil
}

// ---- records

// StoreRecords stores the batch in one transaction: one commit, so one WAL flush, for all of
// it. The jobs' rows are locked first, in id order so that two batches never deadlock: a second
// batch of the same job waits for the first to commit and then sees its rows, so the head each
// computes covers everything committed before it, and the ack it returns is exactly what its
// commit made durable.
func (s *Store) StoreRecords(ctx context.Context, recs []protocol.Record) (map[string]int64, error) {
	heads := map[string]int64{}
	if len(recs) == 0 {
		return heads, nil
	}
	var ids []string
	for _, r := range recs {
		if !slices.Contains(ids, r.Job) {
			ids = append(ids, r.Job)
		}
	}
	ctx, cancel := call(ctx)
	defer cancel()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id FROM jobs WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids)
		if err != nil {
			return err
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(found) < len(ids) {
			for _, id := range ids {
				if !slices.Contains(found, id) {
					return sqlrows.NotFound("job", id)
				}
			}
		}
		// ON CONFLICT DO NOTHING skips a seq already stored, and the second of two copies in
		// the batch: the first copy stays. One statement per record, pipelined in one round
		// trip: with the data as a bytea[] (unnest), the server took five times longer for
		// 64 KiB records.
		b := &pgx.Batch{}
		for _, r := range recs {
			data := []byte(r.Data)
			if data == nil {
				data = []byte{}
			}
			b.Queue(`INSERT INTO records (job, seq, kind, at, data) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (job, seq) DO NOTHING`, r.Job, r.Seq, r.Kind, sqlrows.FormatTime(r.At), data)
		}
		// The head is the end of the run without a gap from last_seq: in that run,
		// seq - row_number() is last_seq for every row.
		for _, id := range ids {
			b.Queue(`UPDATE jobs SET last_seq = COALESCE((
					SELECT max(seq) FROM (
						SELECT seq, seq - row_number() OVER (ORDER BY seq) AS base
						FROM records WHERE job = $1 AND seq > jobs.last_seq) run
					WHERE base = jobs.last_seq), jobs.last_seq)
				WHERE id = $1 RETURNING last_seq`, id).QueryRow(func(row pgx.Row) error {
				var head int64
				if err := row.Scan(&head); err != nil {
					return err
				}
				heads[id] = head
				return nil
			})
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if errors.Is(err, app.ErrNotFound) {
		return nil, fmt.Errorf("store records: %w", err)
	}
	if err != nil {
		return nil, s.fail("store records", err)
	}
	return heads, nil
}

func (s *Store) Records(ctx context.Context, job string, after int64, limit int) ([]protocol.Record, error) {
	ctx, cancel := call(ctx)
	defer cancel()
	var last int64
	err := s.pool.QueryRow(ctx, `SELECT last_seq FROM jobs WHERE id = $1`, job).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("records: %w", sqlrows.NotFound("job", job))
	}
	if err != nil {
		return nil, s.fail(fmt.Sprintf("records of job %q", job), err)
	}
	var lim *int // NULL: LIMIT ALL
	if limit > 0 {
		lim = &limit
	}
	rows, err := s.pool.Query(ctx, `SELECT seq, kind, at, data FROM records
		WHERE job = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4`, job, after, last, lim)
	if err != nil {
		return nil, s.fail(fmt.Sprintf("records of job %q", job), err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (protocol.Record, error) {
		r := protocol.Record{Job: job}
		var at string
		var data []byte
		if err := row.Scan(&r.Seq, &r.Kind, &at, &data); err != nil {
			return r, err
		}
		var err error
		if r.At, err = sqlrows.ParseTime(at); err != nil {
			return r, fmt.Errorf("record %d: stored time does not parse: %w", r.Seq, err)
		}
		r.Data = data
		return r, nil
	})
	if err != nil {
		return nil, s.fail(fmt.Sprintf("records of job %q", job), err)
	}
	return out, nil
}
