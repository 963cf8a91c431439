package pgstore_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/pgstore"
	"github.com/rte-project/rte/app/pgstore/pgtest"
	"github.com/rte-project/rte/app/storetest"
	"github.com/rte-project/rte/protocol"
)

// server is the PostgreSQL server every test of the package shares, each on a database of its
// own; nil when the binaries are missing (missing says why).
var (
	server  *pgtest.Server
	missing error
)

func TestMain(m *testing.M) {
	// Starting PostgreSQL takes seconds: not in the -short inner loop, where every test that
	// needs it skips and says why. testing.Short needs the flags parsed first.
	flag.Parse()
	var err error
	if testing.Short() {
		missing = errors.New("-short does not start PostgreSQL")
	} else {
		server, err = pgtest.Start()
	}
	if errors.Is(err, pgtest.ErrMissing) {
		missing = err
	} else if err != nil {
		fmt.Fprintf(os.Stderr, "start PostgreSQL for the tests: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if server != nil {
		server.Stop()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// newDatabase returns the URL of a new, empty database, or skips the test when there is no
// server.
func newDatabase(t testing.TB) string {
	t.Helper()
	if server == nil {
		t.Skipf("no PostgreSQL to test on: %v", missing)
	}
	url, err := server.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return url
}

func open(t testing.TB, url string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), url)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) app.Store { return open(t, newDatabase(t)) })
}

// TestClaimRaceTwoPools: instances in two processes' worth of pools claim the same runners at
// once, each claim on a connection of its own: one holder per lease.
func TestClaimRaceTwoPools(t *testing.T) {
	url := newDatabase(t)
	a, b := open(t, url), open(t, url)
	storetest.ClaimRace(t, []app.Store{a, b})
}

// TestMigrateTogether: nodes that start at once on an empty database create the schema once;
// none fails.
func TestMigrateTogether(t *testing.T) {
	url := newDatabase(t)
	const nodes = 4
	var wg sync.WaitGroup
	errs := make(chan error, nodes)
	for range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := pgstore.Open(context.Background(), url)
			if err != nil {
				errs <- err
				return
			}
			s.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a node failed to open the database: %v", err)
	}
	var v int
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(context.Background(), `SELECT version FROM schema_version`).Scan(&v); err != nil || v != 2 {
		t.Fatalf("schema version %d (%v), want 2 (the last migration)", v, err)
	}
	var rows int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM schema_version`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("schema_version has %d rows (%v), want 1", rows, err)
	}
}

// TestMigrateFromVersion1: a database a build with schema version 1 wrote (no images column)
// opens, keeps its runner, and stores the images the runner's hello lists.
func TestMigrateFromVersion1(t *testing.T) {
	ctx := context.Background()
	url := newDatabase(t)
	s := open(t, url)
	if err := s.PutRunner(ctx, &app.Runner{Name: "rte01", Mode: protocol.ModeInbound, State: app.StateApproved, Token: "tok-0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	// Version 1 is what the current schema is without migration 2's column.
	if _, err := conn.Exec(ctx, `ALTER TABLE runners DROP COLUMN images; UPDATE schema_version SET version = 1`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	s = open(t, url)
	r, err := s.GetRunner(ctx, "rte01")
	if err != nil || r.Token != "tok-0123456789abcdef" || r.Images != nil {
		t.Fatalf("runner after the migration: %+v, %v", r, err)
	}
	r.Images = []string{"rte:dev", "registry.example/ee-*"}
	if err := s.PutRunner(ctx, r); err != nil {
		t.Fatal(err)
	}
	if r, err := s.GetRunner(ctx, "rte01"); err != nil || strings.Join(r.Images, " ") != "rte:dev registry.example/ee-*" {
		t.Fatalf("images after the migration read back as %q (%v)", r.Images, err)
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	url := newDatabase(t)
	open(t, url).Close()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), `UPDATE schema_version SET version = 99`); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	s, err := pgstore.Open(context.Background(), url)
	if err == nil {
		s.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "schema is version 99") || !strings.Contains(err.Error(), "newer rte-app") {
		t.Fatalf("opening a newer schema got %v, want a refusal naming the version and the fix", err)
	}
}

func TestOpenRefusals(t *testing.T) {
	if server == nil {
		t.Skipf("no PostgreSQL to test on: %v", missing)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	for _, tt := range []struct{ url, says, not string }{
		{"postgres://rte:pw@127.0.0.1:notaport/x", "does not parse", ""},
		{fmt.Sprintf("postgres://rte:hunter2-secret@127.0.0.1:%d/rte", port), fmt.Sprintf("PostgreSQL server at 127.0.0.1:%d/rte does not answer", port), "hunter2-secret"},
		{strings.Replace(server.URL("rte"), "rte:", "rte:wrong", 1), "password authentication failed", "wrong"},
		{server.URL("no_such_db"), `database "no_such_db" does not exist`, ""},
	} {
		s, err := pgstore.Open(context.Background(), tt.url)
		if err == nil {
			s.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tt.says) || (tt.not != "" && strings.Contains(err.Error(), tt.not)) {
			t.Errorf("open %q got %v, want an error saying %q (and not the password)", tt.url, err, tt.says)
		}
	}
}

// TestServerGoesAway: calls on a store whose server went away fail at once, saying the server
// does not answer, which is what the app logs and /ready shows; when the server is back, the
// pool connects again and nothing stored was lost.
func TestServerGoesAway(t *testing.T) {
	url := newDatabase(t)
	p, err := server.Proxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Cut)
	addr := p.Addr
	s := open(t, p.URL(url))
	ctx := context.Background()
	if err := s.CreateJob(ctx, &app.Job{ID: "j1", Runner: "r", State: app.JobRunning, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	rec := protocol.Record{Job: "j1", Seq: 1, Kind: protocol.KindOutput, At: time.Now(), Data: []byte(`{"text":"x"}`)}
	if heads, err := s.StoreRecords(ctx, []protocol.Record{rec}); err != nil || heads["j1"] != 1 {
		t.Fatalf("store through the proxy: %v, %v", heads, err)
	}

	p.Cut()
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"claim", func() error {
			_, err := s.ClaimLeases(ctx, "app-1", "i", []app.LeaseClaim{{Runner: "r"}}, time.Now(), time.Now().Add(time.Second))
			return err
		}},
		{"leases", func() error { _, err := s.Leases(ctx); return err }},
		{"store", func() error { rec.Seq = 2; _, err := s.StoreRecords(ctx, []protocol.Record{rec}); return err }},
	} {
		err := call.do()
		if err == nil || !strings.Contains(err.Error(), "PostgreSQL server at "+addr+"/") || !strings.Contains(err.Error(), "does not answer") {
			t.Errorf("%s with the server gone got %v, want an error saying the server at %s does not answer", call.name, err, addr)
		}
	}

	if err := p.Resume(); err != nil { // the server is back, at the same address
		t.Fatal(err)
	}
	heads, err := s.StoreRecords(ctx, []protocol.Record{rec})
	if err != nil || heads["j1"] != 2 {
		t.Fatalf("store after the server came back: %v, %v; want head 2", heads, err)
	}
	if recs, err := s.Records(ctx, "j1", 0, 0); err != nil || len(recs) != 2 {
		t.Fatalf("records after the server came back: %d (%v), want 2", len(recs), err)
	}
}

// BenchmarkStoreRecords measures the record path with the harness every store shares
// (storetest.BenchRecords), on the test server over loopback TCP, fsync on: each batch of 64
// records is one transaction, one WAL flush.
func BenchmarkStoreRecords(b *testing.B) {
	storetest.BenchRecords(b, func(b *testing.B) app.Store { return open(b, newDatabase(b)) })
}
