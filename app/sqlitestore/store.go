package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/internal/sqlrows"
	"github.com/rte-project/rte/protocol"
)

// busyTimeout is how long a write waits for another process's write to finish before it fails
// with "database is locked". Record batches commit in milliseconds, so ten seconds means the
// other process is stuck, not busy.
const busyTimeout = 10 * time.Second

// pageSize and walAutocheckpoint (in pages) are explained where Open uses them.
const (
	pageSize          = 16 << 10
	walAutocheckpoint = 4096
)

// Store is an app.Store on one SQLite file. It is safe for concurrent use, and several
// processes may share the file.
type Store struct {
	db *sql.DB
	// wmu serialises this process's writes: SQLite admits one writer at a time, and waiting on
	// a mutex is cheaper and fairer than SQLite's busy handler, which sleeps and polls. Other
	// processes still wait through busy_timeout.
	wmu sync.Mutex
}

var _ app.Store = (*Store)(nil)

// Open opens the SQLite file at path, creating it (mode 0600, since it holds the runners'
// tokens) and its schema when missing, and migrating an older schema.
func Open(path string) (*Store, error) {
	if path == "" || path == ":memory:" || strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("open store %q: give a file path without ? or #; for a store in memory use app.NewMemoryStore", path)
	}
	if strings.HasPrefix(path, "file:") {
		path = "./" + path // a plain file name, not an SQLite URI
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	_ = f.Close()
	// Per connection, so every pooled connection gets them:
	//   - journal_mode=WAL: readers do not block the writer, and a commit appends to the log.
	//   - synchronous=FULL: in WAL mode, NORMAL syncs only at checkpoints, so a power cut can
	//     undo the last commits; an acked record must survive one, so every commit syncs the
	//     log before it returns. The cost is one fsync per transaction, hence batches.
	//   - _txlock=immediate: a transaction takes the write lock at BEGIN, so two writers never
	//     both read and then fail to upgrade (SQLITE_BUSY that the busy timeout cannot wait out).
	//   - page_size 16 KiB (takes effect only when the file is created): a 64 KiB output record
	//     spans 5 pages instead of 17, and each page is a write call; it tripled the throughput
	//     of 64 KiB records and doubled that of small ones over the default 4 KiB
	//     (BenchmarkStoreRecords).
	//   - wal_autocheckpoint 4096 pages (64 MiB): a checkpoint copies the log into the file and
	//     syncs both; at the default 1000 pages a busy runner's 4 MiB batches checkpointed every
	//     few commits and halved the throughput. The log file stays at its largest size.
	dsn := fmt.Sprintf("%s?_txlock=immediate&_busy_timeout=%d&_pragma=page_size(%d)&_pragma=wal_autocheckpoint(%d)&_journal_mode=WAL&_synchronous=FULL",
		path, busyTimeout.Milliseconds(), pageSize, walAutocheckpoint)
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	s := &Store{db: db}
	ctx, cancel := context.WithTimeout(context.Background(), busyTimeout+5*time.Second)
	defer cancel()
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: SQLite could not use WAL mode (journal mode is %q): put the file on a local file system", path, mode)
	}
	if err := s.migrate(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return s, nil
}

// Close closes the file. Calls after Close fail.
func (s *Store) Close() error { return s.db.Close() }

// ---- runners

type scanner interface{ Scan(dest ...any) error }

func scanRunner(row scanner) (*app.Runner, error) {
	var r app.Runner
	var state, requested, approved, seen, images string
	if err := row.Scan(&r.Name, &r.URL, &r.Mode, &r.Files, &state, &r.Token, &r.TokenFingerprint,
		&r.Certificate, &r.PendingCertificate, &r.CertificateSHA256, &r.Version, &r.MaxJobs,
		&r.RemoteAddr, &requested, &approved, &seen, &r.Seeded, &images); err != nil {
		return nil, err
	}
	r.Images = sqlrows.SplitImages(images)
	r.State = app.State(state)
	var err error
	if r.RequestedAt, err = sqlrows.ParseTime(requested); err == nil {
		if r.ApprovedAt, err = sqlrows.ParseTime(approved); err == nil {
			r.LastSeen, err = sqlrows.ParseTime(seen)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("runner %q: stored time does not parse: %w", r.Name, err)
	}
	return &r, nil
}

func (s *Store) GetRunner(ctx context.Context, name string) (*app.Runner, error) {
	r, err := scanRunner(s.db.QueryRowContext(ctx, `SELECT `+sqlrows.RunnerColumns+` FROM runners WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, sqlrows.NotFound("runner", name)
	}
	if err != nil {
		return nil, fmt.Errorf("get runner %q: %w", name, err)
	}
	return r, nil
}

func (s *Store) PutRunner(ctx context.Context, r *app.Runner) error {
	if r == nil || r.Name == "" {
		return errors.New("put runner: the runner has no name")
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.db.ExecContext(ctx, `INSERT INTO runners (`+sqlrows.RunnerColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) `+sqlrows.RunnerUpsert,
		r.Name, r.URL, r.Mode, r.Files, string(r.State), r.Token, r.TokenFingerprint,
		r.Certificate, r.PendingCertificate, r.CertificateSHA256, r.Version, r.MaxJobs,
		r.RemoteAddr, sqlrows.FormatTime(r.RequestedAt), sqlrows.FormatTime(r.ApprovedAt), sqlrows.FormatTime(r.LastSeen), r.Seeded, sqlrows.JoinImages(r.Images))
	if err != nil {
		return fmt.Errorf("put runner %q: %w", r.Name, err)
	}
	return nil
}

func (s *Store) DeleteRunner(ctx context.Context, name string) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	res, err := s.db.ExecContext(ctx, `DELETE FROM runners WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("delete runner %q: %w", name, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("delete runner %q: %w", name, err)
	} else if n == 0 {
		return sqlrows.NotFound("runner", name)
	}
	return nil
}

func (s *Store) ListRunners(ctx context.Context) ([]*app.Runner, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sqlrows.RunnerColumns+` FROM runners ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list runners: %w", err)
	}
	defer rows.Close()
	var out []*app.Runner
	for rows.Next() {
		r, err := scanRunner(rows)
		if err != nil {
			return nil, fmt.Errorf("list runners: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list runners: %w", err)
	}
	return out, nil
}

// ---- jobs

// jobValues are the values of every job column but last_seq, in sqlrows.JobColumns' order. Sealed
// secrets are dropped once the job is past dispatch (app.Store.UpdateJob).
func jobValues(j *app.Job) ([]any, error) {
	start := j.Start
	start.Secrets = nil // never stored; see app.JobRequest
	startJSON, err := json.Marshal(start)
	if err != nil {
		return nil, fmt.Errorf("job %q: encode start: %w", j.ID, err)
	}
	names, err := json.Marshal(j.SecretNames)
	if err != nil {
		return nil, fmt.Errorf("job %q: encode secret names: %w", j.ID, err)
	}
	sealed := ""
	if len(j.SealedSecrets) > 0 && (j.State == app.JobQueued || j.State == app.JobDispatched) {
		b, err := json.Marshal(j.SealedSecrets)
		if err != nil {
			return nil, fmt.Errorf("job %q: encode sealed secrets: %w", j.ID, err)
		}
		sealed = string(b)
	}
	return []any{j.ID, j.Runner, string(startJSON), string(names), string(j.State), j.CancelRequested,
		j.Status, j.ExitCode, j.Message, sqlrows.FormatTime(j.CreatedAt), sqlrows.FormatTime(j.DispatchedAt),
		sqlrows.FormatTime(j.StartedAt), sqlrows.FormatTime(j.EndedAt), j.SubmitNode, sealed}, nil
}

func scanJob(row scanner) (*app.Job, error) {
	var j app.Job
	var start, names, state, created, dispatched, started, ended, sealed string
	if err := row.Scan(&j.ID, &j.Runner, &start, &names, &state, &j.CancelRequested, &j.Status,
		&j.ExitCode, &j.Message, &created, &dispatched, &started, &ended, &j.SubmitNode, &sealed, &j.LastSeq); err != nil {
		return nil, err
	}
	if sealed != "" {
		if err := json.Unmarshal([]byte(sealed), &j.SealedSecrets); err != nil {
			return nil, fmt.Errorf("job %q: stored sealed secrets do not decode: %w", j.ID, err)
		}
	}
	j.State = app.JobState(state)
	if err := json.Unmarshal([]byte(start), &j.Start); err != nil {
		return nil, fmt.Errorf("job %q: stored start does not decode: %w", j.ID, err)
	}
	if err := json.Unmarshal([]byte(names), &j.SecretNames); err != nil {
		return nil, fmt.Errorf("job %q: stored secret names do not decode: %w", j.ID, err)
	}
	if len(j.SecretNames) == 0 {
		j.SecretNames = nil
	}
	for _, t := range []struct {
		dst *time.Time
		src string
	}{{&j.CreatedAt, created}, {&j.DispatchedAt, dispatched}, {&j.StartedAt, started}, {&j.EndedAt, ended}} {
		v, err := sqlrows.ParseTime(t.src)
		if err != nil {
			return nil, fmt.Errorf("job %q: stored time does not parse: %w", j.ID, err)
		}
		*t.dst = v
	}
	return &j, nil
}

func (s *Store) CreateJob(ctx context.Context, j *app.Job) error {
	if j == nil || j.ID == "" {
		return errors.New("create job: the job has no id")
	}
	vals, err := jobValues(j)
	if err != nil {
		return fmt.Errorf("create job: %w", err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	res, err := s.db.ExecContext(ctx, `INSERT INTO jobs (`+sqlrows.JobColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT (id) DO NOTHING`, vals...)
	if err != nil {
		return fmt.Errorf("create job %q: %w", j.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("create job %q: %w", j.ID, err)
	} else if n == 0 {
		return fmt.Errorf("job %q: %w", j.ID, app.ErrExists)
	}
	return nil
}

func (s *Store) GetJob(ctx context.Context, id string) (*app.Job, error) {
	j, err := scanJob(s.db.QueryRowContext(ctx, `SELECT `+sqlrows.JobColumns+` FROM jobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, sqlrows.NotFound("job", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get job %q: %w", id, err)
	}
	return j, nil
}

func (s *Store) UpdateJob(ctx context.Context, j *app.Job) error {
	if j == nil {
		return errors.New("update job: no job given")
	}
	vals, err := jobValues(j)
	if err != nil {
		return fmt.Errorf("update job: %w", err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	// last_seq is left out: only StoreRecords moves it. An ended job is not touched, and a
	// requested cancel stays requested (app.Store.UpdateJob), so an app node working from an
	// older read cannot undo what another node stored since.
	res, err := s.db.ExecContext(ctx, `UPDATE jobs SET runner = ?, start = ?, secret_names = ?,
		state = ?, cancel_requested = MAX(cancel_requested, ?), status = ?, exit_code = ?,
		message = ?, created_at = ?, dispatched_at = ?, started_at = ?, ended_at = ?,
		submit_node = ?, sealed_secrets = ? WHERE id = ? AND state != ?`,
		append(vals[1:], vals[0], string(app.JobEnded))...)
	if err != nil {
		return fmt.Errorf("update job %q: %w", j.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("update job %q: %w", j.ID, err)
	} else if n == 0 {
		var state string
		err := s.db.QueryRowContext(ctx, `SELECT state FROM jobs WHERE id = ?`, j.ID).Scan(&state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return sqlrows.NotFound("job", j.ID)
		case err != nil:
			return fmt.Errorf("update job %q: %w", j.ID, err)
		}
		return fmt.Errorf("update job %q: %w", j.ID, app.ErrJobEnded)
	}
	return nil
}

func (s *Store) ListJobs(ctx context.Context, f app.JobFilter) ([]*app.Job, error) {
	var where []string
	var args []any
	if f.Runner != "" {
		where = append(where, "runner = ?")
		args = append(args, f.Runner)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN (?"+strings.Repeat(", ?", len(f.States)-1)+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	q := `SELECT ` + sqlrows.JobColumns + ` FROM jobs`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at DESC, id DESC"
	if f.Limit > 0 {
		q += " LIMIT ?"
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	defer rows.Close()
	var out []*app.Job
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, fmt.Errorf("list jobs: %w", err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return out, nil
}

// ---- records

// StoreRecords stores the batch in one transaction: one commit, so one fsync, for all of it.
// The contiguous head of each job is computed in the same transaction, so the ack it returns
// is exactly what the commit made durable.
func (s *Store) StoreRecords(ctx context.Context, recs []protocol.Record) (map[string]int64, error) {
	heads := map[string]int64{}
	if len(recs) == 0 {
		return heads, nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store records: %w", err)
	}
	defer func() { _ = tx.Rollback() }()

	var order []string
	for _, r := range recs {
		if _, ok := heads[r.Job]; ok {
			continue
		}
		var last int64
		err := tx.QueryRowContext(ctx, `SELECT last_seq FROM jobs WHERE id = ?`, r.Job).Scan(&last)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("store records: %w", sqlrows.NotFound("job", r.Job))
		}
		if err != nil {
			return nil, fmt.Errorf("store records of job %q: %w", r.Job, err)
		}
		heads[r.Job] = last
		order = append(order, r.Job)
	}

	ins, err := tx.PrepareContext(ctx, `INSERT INTO records (job, seq, kind, at, data)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT (job, seq) DO NOTHING`)
	if err != nil {
		return nil, fmt.Errorf("store records: %w", err)
	}
	defer ins.Close()
	for _, r := range recs {
		data := []byte(r.Data)
		if data == nil {
			data = []byte{}
		}
		if _, err := ins.ExecContext(ctx, r.Job, r.Seq, r.Kind, sqlrows.FormatTime(r.At), data); err != nil {
			return nil, fmt.Errorf("store record %d of job %q: %w", r.Seq, r.Job, err)
		}
	}

	for _, job := range order {
		last := heads[job]
		head, err := contiguousHead(ctx, tx, job, last)
		if err != nil {
			return nil, fmt.Errorf("store records of job %q: %w", job, err)
		}
		if head > last {
			if _, err := tx.ExecContext(ctx, `UPDATE jobs SET last_seq = ? WHERE id = ?`, head, job); err != nil {
				return nil, fmt.Errorf("store records of job %q: %w", job, err)
			}
		}
		heads[job] = head
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("store records: commit: %w", err)
	}
	return heads, nil
}

// contiguousHead walks the job's seqs upwards from last and returns the end of the run without
// a gap. It reads only the run and the first seq past a gap, so a gap that stays open costs one
// row per batch, not the whole job.
func contiguousHead(ctx context.Context, tx *sql.Tx, job string, last int64) (int64, error) {
	rows, err := tx.QueryContext(ctx, `SELECT seq FROM records WHERE job = ? AND seq > ? ORDER BY seq`, job, last)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	head := last
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return 0, err
		}
		if seq != head+1 {
			break
		}
		head = seq
	}
	return head, rows.Err()
}

func (s *Store) Records(ctx context.Context, job string, after int64, limit int) ([]protocol.Record, error) {
	var last int64
	err := s.db.QueryRowContext(ctx, `SELECT last_seq FROM jobs WHERE id = ?`, job).Scan(&last)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("records: %w", sqlrows.NotFound("job", job))
	}
	if err != nil {
		return nil, fmt.Errorf("records of job %q: %w", job, err)
	}
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	rows, err := s.db.QueryContext(ctx, `SELECT seq, kind, at, data FROM records
		WHERE job = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?`, job, after, last, limit)
	if err != nil {
		return nil, fmt.Errorf("records of job %q: %w", job, err)
	}
	defer rows.Close()
	var out []protocol.Record
	for rows.Next() {
		r := protocol.Record{Job: job}
		var at string
		var data []byte
		if err := rows.Scan(&r.Seq, &r.Kind, &at, &data); err != nil {
			return nil, fmt.Errorf("records of job %q: %w", job, err)
		}
		if r.At, err = sqlrows.ParseTime(at); err != nil {
			return nil, fmt.Errorf("record %d of job %q: stored time does not parse: %w", r.Seq, job, err)
		}
		r.Data = data
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("records of job %q: %w", job, err)
	}
	return out, nil
}
