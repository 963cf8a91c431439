package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/protocol"
)

// storeImpls is every app.Store the project ships; each must pass the same suite.
var storeImpls = []struct {
	name string
	// open returns a fresh, empty store and the directory of its files ("" in memory).
	open func(t *testing.T) (app.Store, string)
}{
	{"memory", func(*testing.T) (app.Store, string) { return app.NewMemoryStore(), "" }},
	{"sqlite", func(t *testing.T) (app.Store, string) {
		dir := t.TempDir()
		s, err := sqlitestore.Open(filepath.Join(dir, "app.db"))
		if err != nil {
			t.Fatalf("open sqlite store: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s, dir
	}},
}

// forEachStore runs test once per store implementation.
func forEachStore(t *testing.T, test func(t *testing.T, s app.Store)) {
	for _, impl := range storeImpls {
		t.Run(impl.name, func(t *testing.T) {
			s, _ := impl.open(t)
			test(t, s)
		})
	}
}

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.UTC)

func newJob(id, runner string, created time.Time) *app.Job {
	return &app.Job{ID: id, Runner: runner, State: app.JobQueued, CreatedAt: created,
		Start: protocol.JobStart{Job: id, Playbook: "site.yml"}}
}

func mustCreate(t *testing.T, s app.Store, jobs ...*app.Job) {
	t.Helper()
	for _, j := range jobs {
		if err := s.CreateJob(context.Background(), j); err != nil {
			t.Fatalf("create job %s: %v", j.ID, err)
		}
	}
}

func rec(job string, seq int64, kind, text string) protocol.Record {
	data, _ := json.Marshal(protocol.OutputData{Text: text})
	return protocol.Record{Job: job, Seq: seq, Kind: kind, At: t0.Add(time.Duration(seq) * time.Millisecond), Data: data}
}

func storeRecs(t *testing.T, s app.Store, recs ...protocol.Record) map[string]int64 {
	t.Helper()
	heads, err := s.StoreRecords(context.Background(), recs)
	if err != nil {
		t.Fatalf("store records: %v", err)
	}
	return heads
}

// wantSeqs checks that the store returns exactly seqs 1..n of job, each with the text it was
// first stored with.
func wantSeqs(t *testing.T, s app.Store, job string, n int64, text func(seq int64) string) {
	t.Helper()
	got, err := s.Records(context.Background(), job, 0, 0)
	if err != nil {
		t.Fatalf("records of %s: %v", job, err)
	}
	if int64(len(got)) != n {
		t.Fatalf("job %s has %d records, want %d", job, len(got), n)
	}
	for i, r := range got {
		want := rec(job, int64(i+1), protocol.KindOutput, text(int64(i+1)))
		if r.Job != job || r.Seq != want.Seq || r.Kind != want.Kind || !r.At.Equal(want.At) || string(r.Data) != string(want.Data) {
			t.Fatalf("record %d of %s is %+v (data %s), want %+v (data %s)", i, job, r, r.Data, want, want.Data)
		}
	}
}

func TestStoreRunners(t *testing.T) {
	forEachStore(t, func(t *testing.T, s app.Store) {
		ctx := context.Background()
		cert := newCert(t)
		r := &app.Runner{Name: "rte01", URL: "https://127.0.0.1:8000", Mode: protocol.ModeInbound, Files: protocol.FilesTransfer,
			State: app.StateApproved, Token: testToken, TokenFingerprint: protocol.TokenFingerprint(testToken),
			Certificate: cert.der, CertificateSHA256: protocol.CertificateSHA256(cert.der), Version: "1.2.3", MaxJobs: 3,
			RemoteAddr: "127.0.0.1:5555", RequestedAt: t0, ApprovedAt: t0.Add(time.Minute)}
		if err := s.PutRunner(ctx, r); err != nil {
			t.Fatal(err)
		}
		orig := r.Clone()
		r.Certificate[0] ^= 0xff // the store must hold its own copy
		got, err := s.GetRunner(ctx, "rte01")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normRunner(got), normRunner(orig)) {
			t.Errorf("runner read back as\n%+v\nwant\n%+v", got, orig)
		}
		r = orig
		r.State, r.PendingCertificate, r.LastSeen = app.StateWaiting, newCert(t).der, t0.Add(time.Hour)
		if err := s.PutRunner(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := s.PutRunner(ctx, &app.Runner{Name: "a-first", Mode: protocol.ModeOutbound, State: app.StateWaiting}); err != nil {
			t.Fatal(err)
		}
		list, err := s.ListRunners(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 || list[0].Name != "a-first" || !reflect.DeepEqual(normRunner(list[1]), normRunner(r)) {
			t.Errorf("list is %+v, want a-first then the replaced rte01", list)
		}
		if err := s.DeleteRunner(ctx, "rte01"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetRunner(ctx, "rte01"); !errors.Is(err, app.ErrNotFound) {
			t.Errorf("get after delete got %v, want ErrNotFound", err)
		}
		if err := s.DeleteRunner(ctx, "rte01"); !errors.Is(err, app.ErrNotFound) {
			t.Errorf("second delete got %v, want ErrNotFound", err)
		}
	})
}

// normRunner makes times comparable with DeepEqual (a store may hand back another location).
func normRunner(r *app.Runner) app.Runner {
	c := *r.Clone()
	c.RequestedAt, c.ApprovedAt, c.LastSeen = c.RequestedAt.UTC(), c.ApprovedAt.UTC(), c.LastSeen.UTC()
	return c
}

func normJob(j *app.Job) app.Job {
	c := *j.Clone()
	c.CreatedAt, c.DispatchedAt, c.StartedAt, c.EndedAt = c.CreatedAt.UTC(), c.DispatchedAt.UTC(), c.StartedAt.UTC(), c.EndedAt.UTC()
	return c
}

func TestStoreJobs(t *testing.T) {
	forEachStore(t, func(t *testing.T, s app.Store) {
		ctx := context.Background()
		full := &app.Job{
			ID: "j1", Runner: "rte01", State: app.JobQueued, CreatedAt: t0, SecretNames: []string{"become_password", "vault_password"},
			Start: protocol.JobStart{Job: "j1", Playbook: "site.yml", Inventories: []string{"hosts.yml"},
				Files: &protocol.JobFiles{Playbooks: protocol.BundleRef{Hash: "sha256:" + fmt.Sprintf("%064x", 1), Size: 10},
					Inventories: []protocol.BundleRef{{Hash: "sha256:" + fmt.Sprintf("%064x", 2), Size: 20}}},
				Extravars: json.RawMessage(`{"x":1}`), Limit: "web*", Tags: []string{"a"}, SkipTags: []string{"b"},
				Check: true, Diff: true, Verbosity: 2, Forks: 5, TimeoutS: 3600, Env: map[string]string{"K": "v"},
				Secrets: map[string]string{"vault_password": "must-not-be-stored"}},
		}
		mustCreate(t, s, full)
		if err := s.CreateJob(ctx, newJob("j1", "other", t0)); !errors.Is(err, app.ErrExists) {
			t.Errorf("creating j1 twice got %v, want ErrExists", err)
		}
		got, err := s.GetJob(ctx, "j1")
		if err != nil {
			t.Fatal(err)
		}
		want := full.Clone()
		want.Start.Secrets = nil
		if !reflect.DeepEqual(normJob(got), normJob(want)) {
			t.Errorf("job read back as\n%+v\nwant (secrets dropped)\n%+v", got, want)
		}
		if _, err := s.GetJob(ctx, "nope"); !errors.Is(err, app.ErrNotFound) {
			t.Errorf("get unknown job got %v, want ErrNotFound", err)
		}
		if err := s.UpdateJob(ctx, newJob("nope", "rte01", t0)); !errors.Is(err, app.ErrNotFound) {
			t.Errorf("update unknown job got %v, want ErrNotFound", err)
		}

		// UpdateJob writes everything but LastSeq, which only StoreRecords moves.
		storeRecs(t, s, rec("j1", 1, protocol.KindStart, "a"), rec("j1", 2, protocol.KindOutput, "b"))
		stale := got // read before the records
		stale.State, stale.Status, stale.ExitCode, stale.Message = app.JobEnded, protocol.StatusFailed, 2, "boom"
		stale.CancelRequested = true
		stale.DispatchedAt, stale.StartedAt, stale.EndedAt = t0.Add(time.Second), t0.Add(2*time.Second), t0.Add(3*time.Second)
		stale.LastSeq = 0
		if err := s.UpdateJob(ctx, stale); err != nil {
			t.Fatal(err)
		}
		got, err = s.GetJob(ctx, "j1")
		if err != nil {
			t.Fatal(err)
		}
		stale.LastSeq = 2
		if !reflect.DeepEqual(normJob(got), normJob(stale)) {
			t.Errorf("updated job read back as\n%+v\nwant\n%+v", got, stale)
		}

		// Filters: runner, states, limit; newest first, id breaking ties.
		mustCreate(t, s,
			newJob("j2", "rte01", t0.Add(time.Minute)),
			newJob("j3", "rte02", t0.Add(2*time.Minute)),
			newJob("j4", "rte01", t0.Add(3*time.Minute)),
			newJob("j5", "rte01", t0.Add(3*time.Minute)))
		run := newJob("j2", "rte01", t0.Add(time.Minute))
		run.State = app.JobRunning
		if err := s.UpdateJob(ctx, run); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			f    app.JobFilter
			want []string
		}{
			{app.JobFilter{}, []string{"j5", "j4", "j3", "j2", "j1"}},
			{app.JobFilter{Limit: 2}, []string{"j5", "j4"}},
			{app.JobFilter{Runner: "rte01"}, []string{"j5", "j4", "j2", "j1"}},
			{app.JobFilter{Runner: "rte01", States: []app.JobState{app.JobQueued}}, []string{"j5", "j4"}},
			{app.JobFilter{States: []app.JobState{app.JobRunning, app.JobEnded}}, []string{"j2", "j1"}},
			{app.JobFilter{Runner: "rte09"}, nil},
		}
		for _, tt := range tests {
			jobs, err := s.ListJobs(ctx, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, j := range jobs {
				ids = append(ids, j.ID)
			}
			if !reflect.DeepEqual(ids, tt.want) {
				t.Errorf("list %+v gave %v, want %v", tt.f, ids, tt.want)
			}
		}
	})
}

func TestStoreRecordsExactlyOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, s app.Store) {
		ctx := context.Background()
		mustCreate(t, s, newJob("a", "r", t0), newJob("b", "r", t0))
		text := func(seq int64) string { return fmt.Sprintf("line %d", seq) }

		// Gaps: 1, 2, 4 acks 2; 3 arriving acks 4.
		heads := storeRecs(t, s, rec("a", 1, protocol.KindOutput, text(1)), rec("a", 2, protocol.KindOutput, text(2)), rec("a", 4, protocol.KindOutput, text(4)))
		if heads["a"] != 2 || len(heads) != 1 {
			t.Fatalf("after 1,2,4 the heads are %v, want a:2", heads)
		}
		wantSeqs(t, s, "a", 2, text) // 4 waits behind the gap
		heads = storeRecs(t, s, rec("a", 3, protocol.KindOutput, text(3)))
		if heads["a"] != 4 {
			t.Fatalf("after 3 arrived the head is %d, want 4", heads["a"])
		}
		wantSeqs(t, s, "a", 4, text)

		// Duplicates, within a batch and across batches, are ignored: the first copy stays.
		heads = storeRecs(t, s,
			rec("a", 2, protocol.KindOutput, "a second copy"), rec("a", 5, protocol.KindOutput, text(5)),
			rec("a", 5, protocol.KindOutput, "a copy in the same batch"), rec("b", 1, protocol.KindOutput, text(1)))
		if heads["a"] != 5 || heads["b"] != 1 {
			t.Fatalf("heads are %v, want a:5 b:1", heads)
		}
		wantSeqs(t, s, "a", 5, text)
		if j, err := s.GetJob(ctx, "a"); err != nil || j.LastSeq != 5 {
			t.Fatalf("job a has LastSeq %v (err %v), want 5", j, err)
		}

		// Paging.
		page, err := s.Records(ctx, "a", 2, 2)
		if err != nil || len(page) != 2 || page[0].Seq != 3 || page[1].Seq != 4 {
			t.Fatalf("records after 2, limit 2: %+v, %v; want seqs 3 and 4", page, err)
		}
		if _, err := s.Records(ctx, "nope", 0, 0); !errors.Is(err, app.ErrNotFound) {
			t.Errorf("records of an unknown job got %v, want ErrNotFound", err)
		}

		// A batch naming an unknown job stores nothing, not even the known job's records.
		_, err = s.StoreRecords(ctx, []protocol.Record{rec("a", 6, protocol.KindOutput, text(6)), rec("ghost", 1, protocol.KindOutput, "x")})
		if !errors.Is(err, app.ErrNotFound) {
			t.Fatalf("a batch with an unknown job got %v, want ErrNotFound", err)
		}
		wantSeqs(t, s, "a", 5, text)
		if heads := storeRecs(t, s); len(heads) != 0 {
			t.Errorf("an empty batch returned heads %v, want none", heads)
		}
	})
}

// TestStoreRecordsConcurrent has several writers store overlapping, shuffled batches of the
// same jobs at once, as a reconnect that resends while old batches are still committing would.
func TestStoreRecordsConcurrent(t *testing.T) {
	forEachStore(t, func(t *testing.T, s app.Store) {
		const jobs, n, writers = 3, 200, 4
		text := func(seq int64) string { return fmt.Sprintf("line %d", seq) }
		for i := range jobs {
			mustCreate(t, s, newJob(fmt.Sprintf("j%d", i), "r", t0))
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				var all []protocol.Record
				for i := range jobs {
					for seq := int64(1); seq <= n; seq++ {
						all = append(all, rec(fmt.Sprintf("j%d", i), seq, protocol.KindOutput, text(seq)))
					}
				}
				rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
				seen := map[string]int64{}
				for len(all) > 0 {
					k := min(len(all), 1+rng.IntN(64))
					heads, err := s.StoreRecords(context.Background(), all[:k])
					if err != nil {
						errs <- err
						return
					}
					for job, h := range heads {
						if h < seen[job] {
							errs <- fmt.Errorf("head of %s went back from %d to %d", job, seen[job], h)
							return
						}
						seen[job] = h
					}
					all = all[k:]
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for i := range jobs {
			wantSeqs(t, s, fmt.Sprintf("j%d", i), n, text)
		}
	})
}
