package sqlitestore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/internal/sqlrows"
)

// The leases of several app nodes sharing this file (app.Store.ClaimLeases). Each claim is a
// compare-and-set inside one write transaction; _txlock=immediate takes the write lock at BEGIN,
// so two processes claiming at once are serialised by SQLite, not raced.

func (s *Store) ClaimLeases(ctx context.Context, node, instance string, claims []app.LeaseClaim, now, expires time.Time) ([]app.Lease, error) {
	if node == "" || instance == "" {
		return nil, fmt.Errorf("claim leases: node and instance are required")
	}
	if len(claims) == 0 {
		return nil, nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("claim leases: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	// A lease is won when it is free (instance ''), this instance's own, expired at now (times
	// are fixed-width text, so they compare as text; '' is before every time), or forced.
	claim, err := tx.PrepareContext(ctx, `INSERT INTO leases (`+sqlrows.LeaseColumns+`) VALUES (?, ?, ?, ?, ?, 0)
		ON CONFLICT (runner) DO UPDATE SET node = excluded.node, instance = excluded.instance,
			expires = excluded.expires, connected = excluded.connected
		WHERE leases.instance = '' OR leases.instance = excluded.instance OR leases.expires <= ? OR ?`)
	if err != nil {
		return nil, fmt.Errorf("claim leases: %w", err)
	}
	defer claim.Close()
	read, err := tx.PrepareContext(ctx, `SELECT `+sqlrows.LeaseColumns+` FROM leases WHERE runner = ?`)
	if err != nil {
		return nil, fmt.Errorf("claim leases: %w", err)
	}
	defer read.Close()
	out := make([]app.Lease, 0, len(claims))
	for _, c := range claims {
		if _, err := claim.ExecContext(ctx, c.Runner, node, instance, sqlrows.FormatTime(expires), c.Connected, sqlrows.FormatTime(now), c.Force); err != nil {
			return nil, fmt.Errorf("claim lease of runner %q: %w", c.Runner, err)
		}
		l, err := sqlrows.ScanLease(read.QueryRowContext(ctx, c.Runner))
		if err != nil {
			return nil, fmt.Errorf("claim lease of runner %q: %w", c.Runner, err)
		}
		out = append(out, l)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("claim leases: commit: %w", err)
	}
	return out, nil
}

func (s *Store) ReleaseLeases(ctx context.Context, instance string, runners []string) error {
	if runners != nil && len(runners) == 0 {
		return nil
	}
	q := `UPDATE leases SET node = '', instance = '', expires = '', connected = 0 WHERE instance = ?`
	args := []any{instance}
	if runners != nil {
		q += ` AND runner IN (?` + strings.Repeat(", ?", len(runners)-1) + `)`
		for _, r := range runners {
			args = append(args, r)
		}
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := s.db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
}

func (s *Store) Leases(ctx context.Context) ([]app.Lease, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sqlrows.LeaseColumns+` FROM leases ORDER BY runner`)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	defer rows.Close()
	var out []app.Lease
	for rows.Next() {
		l, err := sqlrows.ScanLease(rows)
		if err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return out, nil
}

func (s *Store) WakeHolder(ctx context.Context, runner string) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := s.db.ExecContext(ctx, `INSERT INTO leases (`+sqlrows.LeaseColumns+`) VALUES (?, '', '', '', 0, 1)
		ON CONFLICT (runner) DO UPDATE SET wake = wake + 1`, runner); err != nil {
		return fmt.Errorf("wake the holder of runner %q: %w", runner, err)
	}
	return nil
}
