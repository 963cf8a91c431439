package sqlitestore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/storetest"
)

// TestLeaseClaimsRace: many app instances in two processes' worth of stores claim the same
// runners at the same instant; each lease ends with exactly one holder.
func TestLeaseClaimsRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	a, b := open(t, path), open(t, path)
	defer a.Close()
	defer b.Close()
	storetest.ClaimRace(t, []app.Store{a, b})
}

// TestMigrateFromVersion1: a file written by a build with schema version 1 opens, keeps what it
// held, and takes the new columns and the leases.
func TestMigrateFromVersion1(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE TABLE schema_version (version INTEGER NOT NULL)`,
		`INSERT INTO schema_version (version) VALUES (1)`,
		`CREATE TABLE runners (name TEXT PRIMARY KEY, url TEXT NOT NULL, mode TEXT NOT NULL, files TEXT NOT NULL,
			state TEXT NOT NULL, token TEXT NOT NULL, token_fingerprint TEXT NOT NULL, certificate BLOB,
			pending_certificate BLOB, certificate_sha256 TEXT NOT NULL, version TEXT NOT NULL,
			max_jobs INTEGER NOT NULL, remote_addr TEXT NOT NULL, requested_at TEXT NOT NULL,
			approved_at TEXT NOT NULL, last_seen TEXT NOT NULL)`,
		`CREATE TABLE jobs (id TEXT PRIMARY KEY, runner TEXT NOT NULL, start TEXT NOT NULL,
			secret_names TEXT NOT NULL, state TEXT NOT NULL, cancel_requested INTEGER NOT NULL,
			status TEXT NOT NULL, exit_code INTEGER NOT NULL, message TEXT NOT NULL,
			created_at TEXT NOT NULL, dispatched_at TEXT NOT NULL, started_at TEXT NOT NULL,
			ended_at TEXT NOT NULL, last_seq INTEGER NOT NULL DEFAULT 0)`,
		`CREATE TABLE records (job TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
			at TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (job, seq))`,
		`INSERT INTO runners VALUES ('rte01', 'https://h:1', 'inbound', 'local', 'approved',
			'tok-0123456789abcdef', 'abcd-ef12', NULL, NULL, '', '1.0', 0, '', '', '', '')`,
		`INSERT INTO jobs VALUES ('j1', 'rte01', '{"job":"j1","playbook":"site.yml"}', 'null', 'queued',
			0, '', 0, '', '2026-12-02T10:00:00.000000000Z', '', '', '', 0)`,
	} {
		if _, err := raw.Exec(stmt); err != nil {
			t.Fatalf("write a version 1 file: %v", err)
		}
	}
	raw.Close()

	s := open(t, path)
	defer s.Close()
	r, err := s.GetRunner(ctx, "rte01")
	if err != nil || r.Token != "tok-0123456789abcdef" || r.Seeded || r.Images != nil {
		t.Fatalf("runner after the migration: %+v, %v", r, err)
	}
	j, err := s.GetJob(ctx, "j1")
	if err != nil || j.SubmitNode != "" || j.SealedSecrets != nil || !j.CreatedAt.Equal(t0) {
		t.Fatalf("job after the migration: %+v, %v", j, err)
	}
	r.Seeded, r.Images = true, []string{"rte:dev"}
	if err := s.PutRunner(ctx, r); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.GetRunner(ctx, "rte01"); !r.Seeded || !slices.Equal(r.Images, []string{"rte:dev"}) {
		t.Fatalf("seeded and images did not read back: %+v", r)
	}
	if _, err := s.ClaimLeases(ctx, "app-1", "a", []app.LeaseClaim{{Runner: "rte01"}}, t0, t0.Add(time.Second)); err != nil {
		t.Fatalf("claim on a migrated file: %v", err)
	}
}
