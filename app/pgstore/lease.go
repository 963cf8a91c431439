package pgstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/internal/sqlrows"
)

// The leases of several app nodes sharing the database (app.Store.ClaimLeases). Each claim is
// an INSERT ... ON CONFLICT DO UPDATE whose WHERE is the compare: PostgreSQL locks the
// conflicting row and evaluates the WHERE against its latest committed version, so of two
// nodes claiming at once the second sees the first's lease and leaves it. A row is locked even
// when the WHERE leaves it alone, so the SELECT that follows, in the same transaction, reads
// the lease exactly as it stands.

func (s *Store) ClaimLeases(ctx context.Context, node, instance string, claims []app.LeaseClaim, now, expires time.Time) ([]app.Lease, error) {
	if node == "" || instance == "" {
		return nil, fmt.Errorf("claim leases: node and instance are required")
	}
	if len(claims) == 0 {
		return nil, nil
	}
	// Rows are locked in runner order, whatever the claim order, so that two nodes claiming
	// overlapping sets wait for each other instead of deadlocking.
	sorted := slices.Clone(claims)
	slices.SortFunc(sorted, func(a, b app.LeaseClaim) int { return strings.Compare(a.Runner, b.Runner) })
	runners := make([]string, len(claims))
	for i, c := range claims {
		runners[i] = c.Runner
	}
	ctx, cancel := call(ctx)
	defer cancel()
	stored := map[string]app.Lease{}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		// A lease is won when it is free (instance ''), this instance's own, expired at now
		// (times are fixed-width text, so they compare as text; '' is before every time), or
		// forced. The wake counter is kept.
		for _, c := range sorted {
			b.Queue(`INSERT INTO leases (`+sqlrows.LeaseColumns+`) VALUES ($1, $2, $3, $4, $5, 0)
				ON CONFLICT (runner) DO UPDATE SET node = excluded.node, instance = excluded.instance,
					expires = excluded.expires, connected = excluded.connected
				WHERE leases.instance = '' OR leases.instance = excluded.instance
					OR leases.expires <= $6 OR $7`,
				c.Runner, node, instance, sqlrows.FormatTime(expires), c.Connected, sqlrows.FormatTime(now), c.Force)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT `+sqlrows.LeaseColumns+` FROM leases WHERE runner = ANY($1)`, runners)
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (app.Lease, error) { return sqlrows.ScanLease(row) })
		if err != nil {
			return err
		}
		for _, l := range got {
			stored[l.Runner] = l
		}
		return nil
	})
	if err != nil {
		return nil, s.fail("claim leases", err)
	}
	out := make([]app.Lease, len(claims))
	for i, c := range claims {
		out[i] = stored[c.Runner]
	}
	return out, nil
}

func (s *Store) ReleaseLeases(ctx context.Context, instance string, runners []string) error {
	if runners != nil && len(runners) == 0 {
		return nil
	}
	ctx, cancel := call(ctx)
	defer cancel()
	// A NULL array (runners nil) releases every lease of the instance.
	if _, err := s.pool.Exec(ctx, `UPDATE leases SET node = '', instance = '', expires = '', connected = false
		WHERE instance = $1 AND ($2::text[] IS NULL OR runner = ANY($2))`, instance, runners); err != nil {
		return s.fail("release leases", err)
	}
	return nil
}

func (s *Store) Leases(ctx context.Context) ([]app.Lease, error) {
	ctx, cancel := call(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT `+sqlrows.LeaseColumns+` FROM leases ORDER BY runner`)
	if err != nil {
		return nil, s.fail("list leases", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (app.Lease, error) { return sqlrows.ScanLease(row) })
	if err != nil {
		return nil, s.fail("list leases", err)
	}
	return out, nil
}

func (s *Store) WakeHolder(ctx context.Context, runner string) error {
	ctx, cancel := call(ctx)
	defer cancel()
	if _, err := s.pool.Exec(ctx, `INSERT INTO leases (`+sqlrows.LeaseColumns+`) VALUES ($1, '', '', '', false, 1)
		ON CONFLICT (runner) DO UPDATE SET wake = leases.wake + 1`, runner); err != nil {
		return s.fail(fmt.Sprintf("wake the holder of runner %q", runner), err)
	}
	return nil
}
