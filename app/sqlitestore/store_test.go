package sqlitestore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/app/storetest"
	"github.com/rte-project/rte/protocol"
)

// The behaviour every app.Store shares is tested once for all of them by package storetest
// (run on this store from package app's store_test.go). These tests cover what only a file has:
// persistence, sharing, the schema.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func open(t testing.TB, path string) *sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	return s
}

func job(id string) *app.Job {
	return &app.Job{ID: id, Runner: "rte01", State: app.JobRunning, CreatedAt: t0, Start: protocol.JobStart{Job: id, Playbook: "site.yml"}}
}

func record(job string, seq int64, text string) protocol.Record {
	data, _ := json.Marshal(protocol.OutputData{Text: text})
	return protocol.Record{Job: job, Seq: seq, Kind: protocol.KindOutput, At: t0.Add(time.Duration(seq)), Data: data}
}

// TestReopen: what a store acknowledged is there after Close and Open, as after a restart.
func TestReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	s := open(t, path)
	if err := s.PutRunner(ctx, &app.Runner{Name: "rte01", Mode: protocol.ModeInbound, State: app.StateApproved, Token: "tok-0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(ctx, job("j1")); err != nil {
		t.Fatal(err)
	}
	heads, err := s.StoreRecords(ctx, []protocol.Record{record("j1", 1, "a"), record("j1", 2, "b")})
	if err != nil || heads["j1"] != 2 {
		t.Fatalf("store records: %v, heads %v; want j1:2", err, heads)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("store file mode is %v (%v), want 0600: it holds the runners' tokens", fi.Mode().Perm(), err)
	}

	s = open(t, path)
	defer s.Close()
	if r, err := s.GetRunner(ctx, "rte01"); err != nil || r.Token != "tok-0123456789abcdef" {
		t.Errorf("runner after reopen: %+v, %v", r, err)
	}
	j, err := s.GetJob(ctx, "j1")
	if err != nil || j.LastSeq != 2 || j.State != app.JobRunning || !j.CreatedAt.Equal(t0) {
		t.Fatalf("job after reopen: %+v, %v; want running with LastSeq 2", j, err)
	}
	recs, err := s.Records(ctx, "j1", 0, 0)
	if err != nil || len(recs) != 2 || string(recs[1].Data) != `{"text":"b"}` || !recs[1].At.Equal(t0.Add(2)) {
		t.Fatalf("records after reopen: %+v, %v", recs, err)
	}
	// A resend after the restart stores nothing twice and acks the same.
	if heads, err := s.StoreRecords(ctx, []protocol.Record{record("j1", 2, "b again"), record("j1", 3, "c")}); err != nil || heads["j1"] != 3 {
		t.Fatalf("resend after reopen: %v, heads %v; want j1:3", err, heads)
	}
}

// TestSharedFile has two stores on one file, as two rte-app processes would, writing records
// of the same jobs at once: the busy timeout makes one wait for the other, and nothing is lost
// or stored twice.
func TestSharedFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	a, b := open(t, path), open(t, path)
	defer a.Close()
	defer b.Close()
	const n = 300
	for _, id := range []string{"x", "y"} {
		if err := a.CreateJob(ctx, job(id)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i, s := range []*sqlitestore.Store{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each writes every record, in batches of 10, starting at another offset.
			for k := 0; k < n; k += 10 {
				var batch []protocol.Record
				for seq := int64(k + 1); seq <= int64(k+10); seq++ {
					s := (seq+int64(i*n/2)-1)%n + 1
					batch = append(batch, record("x", s, fmt.Sprint(s)), record("y", s, fmt.Sprint(s)))
				}
				if _, err := s.StoreRecords(ctx, batch); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a writer failed: %v", err)
	}
	for _, id := range []string{"x", "y"} {
		recs, err := b.Records(ctx, id, 0, 0)
		if err != nil || len(recs) != n {
			t.Fatalf("job %s has %d records (%v), want %d", id, len(recs), err, n)
		}
		for i, r := range recs {
			if r.Seq != int64(i+1) || string(r.Data) != fmt.Sprintf(`{"text":"%d"}`, i+1) {
				t.Fatalf("record %d of %s is %d %s", i, id, r.Seq, r.Data)
			}
		}
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	open(t, path).Close()
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(`UPDATE schema_version SET version = 99`); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	_, err = sqlitestore.Open(path)
	if err == nil || !strings.Contains(err.Error(), "schema is version 99") || !strings.Contains(err.Error(), "newer rte-app") {
		t.Fatalf("opening a newer schema got %v, want a refusal naming the version and the fix", err)
	}
}

func TestOpenRefusals(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ path, says string }{
		{"", "give a file path"},
		{":memory:", "app.NewMemoryStore"},
		{filepath.Join(dir, "a?mode=ro"), "without ? or #"},
		{filepath.Join(dir, "missing-dir", "app.db"), "no such file or directory"},
	} {
		if s, err := sqlitestore.Open(tt.path); err == nil || !strings.Contains(err.Error(), tt.says) {
			if s != nil {
				s.Close()
			}
			t.Errorf("open %q got %v, want an error saying %q", tt.path, err, tt.says)
		}
	}
}

func TestClosedStoreFails(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "app.db"))
	s.Close()
	if _, err := s.GetJob(context.Background(), "j1"); err == nil || errors.Is(err, app.ErrNotFound) {
		t.Errorf("get on a closed store got %v, want a failure that is not ErrNotFound", err)
	}
}

// BenchmarkStoreRecords measures the record path on a file with the harness every store shares
// (storetest.BenchRecords): each batch of 64 records is one transaction with one fsync
// (synchronous=FULL). Set RTE_BENCH_DIR to measure on the disk that will hold the file.
func BenchmarkStoreRecords(b *testing.B) {
	storetest.BenchRecords(b, func(b *testing.B) app.Store {
		dir := os.Getenv("RTE_BENCH_DIR")
		if dir == "" {
			dir = b.TempDir()
		} else {
			var err error
			if dir, err = os.MkdirTemp(dir, "bench"); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = os.RemoveAll(dir) })
		}
		s := open(b, filepath.Join(dir, "app.db"))
		b.Cleanup(func() { _ = s.Close() })
		return s
	})
}
