// Package sqlrows is what the SQL stores of the app half (sqlitestore, pgstore) write alike:
// the text form of times, the columns of runners, jobs and leases, and the runner upsert, so
// that both stores keep one schema in two dialects and a time written by one reads back the
// same in the other, and the migration runner (schema_version, steps applied in order, a newer
// schema refused). It holds no connection and opens no transaction; each store owns its
// schema's migration steps, the lock it migrates under, its queries and its scanning.
package sqlrows

import (
	"fmt"
	"strings"
	"time"

	"github.com/rte-project/rte/app"
)

// TimeLayout is RFC 3339 with all nine fraction digits, always UTC: fixed width, so times sort
// as text (and a lease's expiry compares as text), and exact to the nanosecond, which neither
// SQLite's nor PostgreSQL's own time types keep.
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// FormatTime is t in TimeLayout; the zero time is "".
func FormatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(TimeLayout)
}

// ParseTime reads what FormatTime wrote; "" is the zero time.
func ParseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// NotFound wraps app.ErrNotFound, naming what was looked for.
func NotFound(what, name string) error { return fmt.Errorf("%s %q: %w", what, name, app.ErrNotFound) }

// Column lists, in the order the stores scan and bind them.
const (
	RunnerColumns = `name, url, mode, files, state, token, token_fingerprint, certificate,
	pending_certificate, certificate_sha256, version, max_jobs, remote_addr, requested_at,
	approved_at, last_seen, seeded, images`
	JobColumns = `id, runner, start, secret_names, state, cancel_requested, status, exit_code,
	message, created_at, dispatched_at, started_at, ended_at, submit_node, sealed_secrets, last_seq`
	LeaseColumns = `runner, node, instance, expires, connected, wake`
)

// RunnerUpsert ends an INSERT of RunnerColumns: a runner put again replaces every column.
const RunnerUpsert = `ON CONFLICT (name) DO UPDATE SET url = excluded.url, mode = excluded.mode,
	files = excluded.files, state = excluded.state, token = excluded.token,
	token_fingerprint = excluded.token_fingerprint, certificate = excluded.certificate,
	pending_certificate = excluded.pending_certificate,
	certificate_sha256 = excluded.certificate_sha256, version = excluded.version,
	max_jobs = excluded.max_jobs, remote_addr = excluded.remote_addr,
	requested_at = excluded.requested_at, approved_at = excluded.approved_at,
	last_seen = excluded.last_seen, seeded = excluded.seeded, images = excluded.images`

// JoinImages is how both stores keep Runner.Images in one text column: the entries joined with
// commas, which no image reference or pattern may hold (protocol.ValidImagePattern).
func JoinImages(images []string) string { return strings.Join(images, ",") }

// SplitImages undoes JoinImages; "" is no images.
func SplitImages(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// Scanner is a row of either store's driver (*sql.Row, *sql.Rows, pgx.Row).
type Scanner interface{ Scan(dest ...any) error }

// ScanLease reads a row of LeaseColumns.
func ScanLease(row Scanner) (app.Lease, error) {
	var l app.Lease
	var expires string
	if err := row.Scan(&l.Runner, &l.Node, &l.Instance, &expires, &l.Connected, &l.Wake); err != nil {
		return l, err
	}
	t, err := ParseTime(expires)
	if err != nil {
		return l, fmt.Errorf("lease of runner %q: stored time does not parse: %w", l.Runner, err)
	}
	l.Expires = t
	return l, nil
}
