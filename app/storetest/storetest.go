// Package storetest is the conformance suite of app.Store: what every store must do, checked
// the same way for the memory store, package sqlitestore, package pgstore, and any store an app
// author writes. Run it from a test of the store's own package:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) app.Store { return openEmptyStore(t) })
//	}
//
// It checks the contract written on app.Store: copies in and out, runners, jobs and their
// filters, secrets never stored in clear and sealed ones dropped once a job is past dispatch,
// records unique on (job, seq) with the cumulative ack computed in the same commit, leases as
// compare-and-set (also under concurrent claims), and the update rules that keep app nodes from
// undoing each other.
//
// It does not check what only one store has (a file's persistence and permissions, a schema
// and its migrations, a server that goes away): those tests live beside the store.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// Run runs every test of the suite as a subtest of t. open returns a new, empty store for one
// subtest and arranges its closing (t.Cleanup); subtests do not share a store, and run one
// after another.
func Run(t *testing.T, open func(t *testing.T) app.Store) {
	for _, tc := range []struct {
		name string
		test func(t *testing.T, s app.Store)
	}{
		{"Runners", testRunners},
		{"Jobs", testJobs},
		{"RecordsExactlyOnce", testRecordsExactlyOnce},
		{"RecordsConcurrent", testRecordsConcurrent},
		{"Leases", testLeases},
		{"LeaseClaimsRace", testLeaseClaimsRace},
		{"UpdateJobAcrossNodes", testUpdateJobAcrossNodes},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, open(t)) })
	}
}

// t0 has nanoseconds, so a store that rounds times (PostgreSQL keeps microseconds) is caught.
var t0 = time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.UTC)

const token = "rte-token-0123456789abcdef"

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
		if r.Job != job || r.Seq != want.Seq || r.Kind != want.Kind || !r.At.Equal(want.At) || !bytes.Equal(r.Data, want.Data) {
			t.Fatalf("record %d of %s is %+v (data %s), want %+v (data %s)", i, job, r, r.Data, want, want.Data)
		}
	}
}

// der stands for a certificate: a store keeps the bytes and never parses them.
func der(seed byte) []byte {
	b := make([]byte, 600)
	for i := range b {
		b[i] = seed + byte(i)
	}
	return b
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

func testRunners(t *testing.T, s app.Store) {
	ctx := context.Background()
	cert := der(1)
	r := &app.Runner{Name: "rte01", URL: "https://127.0.0.1:8000", Mode: protocol.ModeInbound, Files: protocol.FilesTransfer,
		State: app.StateApproved, Token: token, TokenFingerprint: protocol.TokenFingerprint(token),
		Certificate: cert, CertificateSHA256: protocol.CertificateSHA256(cert), Version: "1.2.3", MaxJobs: 3,
		RemoteAddr: "127.0.0.1:5555", RequestedAt: t0, ApprovedAt: t0.Add(time.Minute), Seeded: true,
		Images: []string{"registry.example/ee:2.14", "registry.example/ee-*"}}
	if err := s.PutRunner(ctx, r); err != nil {
		t.Fatal(err)
	}
	orig := r.Clone()
	r.Certificate[0] ^= 0xff // the store must hold its own copy
	r.Images[0] = "changed"
	got, err := s.GetRunner(ctx, "rte01")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normRunner(got), normRunner(orig)) {
		t.Errorf("runner read back as\n%+v\nwant\n%+v", got, orig)
	}
	got.Certificate[1] ^= 0xff // nor hand out its own
	if again, err := s.GetRunner(ctx, "rte01"); err != nil || !bytes.Equal(again.Certificate, orig.Certificate) {
		t.Errorf("changing a runner read from the store changed the stored one: %v", err)
	}
	r = orig
	r.State, r.PendingCertificate, r.LastSeen, r.Seeded, r.Images = app.StateWaiting, der(2), t0.Add(time.Hour), false, nil
	if err := s.PutRunner(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.PutRunner(ctx, &app.Runner{Name: "a-first", Mode: protocol.ModeOutbound, State: app.StateWaiting}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutRunner(ctx, &app.Runner{Mode: protocol.ModeOutbound}); err == nil {
		t.Error("a runner without a name was stored")
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
}

func testJobs(t *testing.T, s app.Store) {
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
	stale.Start.Secrets = map[string]string{"vault_password": "must-not-be-stored-either"}
	if err := s.UpdateJob(ctx, stale); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetJob(ctx, "j1")
	if err != nil {
		t.Fatal(err)
	}
	stale.LastSeq = 2
	stale.Start.Secrets = nil
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
}

func testRecordsExactlyOnce(t *testing.T, s app.Store) {
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

	// A record's data is held as stored, byte for byte, and not aliased.
	data := json.RawMessage(`{"text":"caf\u00e9 \u0000 end"}`)
	r := protocol.Record{Job: "b", Seq: 2, Kind: protocol.KindOutput, At: t0, Data: data}
	storeRecs(t, s, r)
	data[2] = 'X'
	if got, err := s.Records(ctx, "b", 1, 0); err != nil || len(got) != 1 || string(got[0].Data) != `{"text":"caf\u00e9 \u0000 end"}` {
		t.Fatalf("record 2 of b read back as %+v (%v), want its data unchanged", got, err)
	}
}

// testRecordsConcurrent has several writers store overlapping, shuffled batches of the same
// jobs at once, as a reconnect that resends while old batches are still committing would.
func testRecordsConcurrent(t *testing.T, s app.Store) {
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
}

// testLeases is the lease contract: a claim is a compare-and-set that wins a free, own or
// expired lease (or any, forced), keeps the Wake, and a release frees only the releaser's
// leases.
func testLeases(t *testing.T, s app.Store) {
	ctx := context.Background()
	ttl := 10 * time.Second
	claim := func(node, inst string, now time.Time, claims ...app.LeaseClaim) []app.Lease {
		t.Helper()
		got, err := s.ClaimLeases(ctx, node, inst, claims, now, now.Add(ttl))
		if err != nil {
			t.Fatalf("%s claims %v: %v", node, claims, err)
		}
		if len(got) != len(claims) {
			t.Fatalf("%s claimed %d leases and got %d back", node, len(claims), len(got))
		}
		return got
	}
	holder := func(l app.Lease) string { return l.Node + "/" + l.Instance }

	got := claim("app-1", "a", t0, app.LeaseClaim{Runner: "r1"}, app.LeaseClaim{Runner: "r2", Connected: true})
	if holder(got[0]) != "app-1/a" || holder(got[1]) != "app-1/a" || got[0].Connected || !got[1].Connected || !got[1].Expires.Equal(t0.Add(ttl)) {
		t.Fatalf("first claims gave %+v, want both held by app-1/a until %s, r2 connected", got, t0.Add(ttl))
	}
	if got := claim("app-2", "b", t0.Add(5*time.Second), app.LeaseClaim{Runner: "r1"}); holder(got[0]) != "app-1/a" || !got[0].Expires.Equal(t0.Add(ttl)) {
		t.Fatalf("a claim on a live lease gave %+v, want it left with app-1/a", got[0])
	}
	// One nanosecond before the expiry the lease is still live; at the expiry it is not.
	if got := claim("app-2", "b", t0.Add(ttl-time.Nanosecond), app.LeaseClaim{Runner: "r2"}); holder(got[0]) != "app-1/a" {
		t.Fatalf("a claim 1ns before the expiry gave %+v, want it left with app-1/a", got[0])
	}
	for range 2 {
		if err := s.WakeHolder(ctx, "r1"); err != nil {
			t.Fatal(err)
		}
	}
	if got := claim("app-1", "a", t0.Add(5*time.Second), app.LeaseClaim{Runner: "r1", Connected: true}); holder(got[0]) != "app-1/a" || got[0].Wake != 2 || !got[0].Expires.Equal(t0.Add(15*time.Second)) || !got[0].Connected {
		t.Fatalf("a renewal gave %+v, want app-1/a until +15s, connected, with Wake 2 kept", got[0])
	}
	if got := claim("app-2", "b", t0.Add(15*time.Second), app.LeaseClaim{Runner: "r1"}); holder(got[0]) != "app-2/b" || got[0].Wake != 2 || got[0].Connected {
		t.Fatalf("a claim at the expiry gave %+v, want app-2/b with Wake 2, not connected", got[0])
	}
	if got := claim("app-1", "a", t0.Add(16*time.Second), app.LeaseClaim{Runner: "r1"}); holder(got[0]) != "app-2/b" {
		t.Fatalf("a renewal of a lost lease gave %+v, want it left with app-2/b", got[0])
	}
	if got := claim("app-1", "a2", t0.Add(16*time.Second), app.LeaseClaim{Runner: "r1", Force: true}); holder(got[0]) != "app-1/a2" {
		t.Fatalf("a forced claim gave %+v, want app-1/a2", got[0])
	}

	// A release frees only the releaser's leases.
	if err := s.ReleaseLeases(ctx, "b", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseLeases(ctx, "a", []string{"r2"}); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseLeases(ctx, "a", []string{}); err != nil {
		t.Fatal(err)
	}
	if err := s.WakeHolder(ctx, "r9"); err != nil {
		t.Fatal(err)
	}
	all, err := s.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []app.Lease{
		{Runner: "r1", Node: "app-1", Instance: "a2", Expires: t0.Add(26 * time.Second), Wake: 2},
		{Runner: "r2"},
		{Runner: "r9", Wake: 1},
	}
	for i := range all {
		all[i].Expires = all[i].Expires.UTC()
	}
	if !reflect.DeepEqual(all, want) {
		t.Fatalf("leases after the releases:\n%+v\nwant\n%+v", all, want)
	}
	if got := claim("app-2", "b", t0, app.LeaseClaim{Runner: "r2"}); holder(got[0]) != "app-2/b" {
		t.Fatalf("a claim of a released lease gave %+v, want app-2/b", got[0])
	}
	if _, err := s.ClaimLeases(ctx, "", "", []app.LeaseClaim{{Runner: "r1"}}, t0, t0); err == nil {
		t.Error("a claim without node and instance was taken")
	}
}

func testLeaseClaimsRace(t *testing.T, s app.Store) { ClaimRace(t, []app.Store{s}) }

// ClaimRace has many app instances claim the same runners at the same instant, spread over
// stores (several handles on one database, as several processes hold): each lease ends with
// exactly one holder, and every claimer was told either that it won or who did. A store on a
// server runs the claims on several connections at once, so this is a real race there; a store
// that serialises its writes passes it trivially. Run calls it with one store.
func ClaimRace(t *testing.T, stores []app.Store) {
	t.Helper()
	ctx := context.Background()
	claims := []app.LeaseClaim{{Runner: "r1"}, {Runner: "r2"}, {Runner: "r3"}}
	const instances = 8
	got := make([][]app.Lease, instances)
	var wg sync.WaitGroup
	errs := make(chan error, instances)
	start := make(chan struct{})
	for i := range instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ls, err := stores[i%len(stores)].ClaimLeases(ctx, fmt.Sprintf("app-%d", i), fmt.Sprintf("inst-%d", i), claims, t0, t0.Add(10*time.Second))
			if err != nil {
				errs <- err
				return
			}
			got[i] = ls
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a claim failed: %v", err)
	}
	final, err := stores[0].Leases(ctx)
	if err != nil || len(final) != len(claims) {
		t.Fatalf("leases %+v (%v), want one per runner", final, err)
	}
	for k, l := range final {
		if l.Instance == "" {
			t.Fatalf("runner %s has no holder after every instance claimed it", l.Runner)
		}
		for i := range instances {
			mine := fmt.Sprintf("inst-%d", i)
			switch h := got[i][k].Instance; {
			case h == mine && h != l.Instance:
				t.Fatalf("instance %d and %s both won runner %s", i, l.Instance, l.Runner)
			case h != mine && h != l.Instance:
				t.Fatalf("instance %d was told %s holds %s, but %s does", i, h, l.Runner, l.Instance)
			}
		}
	}
}

// testUpdateJobAcrossNodes: the rules that keep one app node from undoing another's change
// when both work from their own reads.
func testUpdateJobAcrossNodes(t *testing.T, s app.Store) {
	ctx := context.Background()
	j := newJob("j1", "rte01", t0)
	j.SecretNames = []string{"vault_password"}
	j.SealedSecrets = map[string]string{"vault_password": "v1:c2VhbGVk"}
	j.SubmitNode = "app-2"
	mustCreate(t, s, j)
	got, err := s.GetJob(ctx, "j1")
	if err != nil || got.SubmitNode != "app-2" || !reflect.DeepEqual(got.SealedSecrets, j.SealedSecrets) {
		t.Fatalf("job read back as %+v (%v), want its submit node and sealed secrets", got, err)
	}

	got.State = app.JobDispatched
	if err := s.UpdateJob(ctx, got); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.GetJob(ctx, "j1"); got.SealedSecrets == nil {
		t.Fatal("sealed secrets were dropped from a dispatched job, whose job.start may be sent again")
	}
	canceled := got.Clone()
	canceled.CancelRequested = true
	if err := s.UpdateJob(ctx, canceled); err != nil {
		t.Fatal(err)
	}
	stale := got.Clone() // read before the cancel, by another node
	stale.State = app.JobRunning
	if err := s.UpdateJob(ctx, stale); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetJob(ctx, "j1")
	if !got.CancelRequested || got.SealedSecrets != nil || got.State != app.JobRunning {
		t.Fatalf("after a stale update: %+v; want the cancel kept, the sealed secrets gone, running", got)
	}
	// Sealed secrets do not come back with an update that still carries them.
	stale.State = app.JobRunning
	if err := s.UpdateJob(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.GetJob(ctx, "j1"); got.SealedSecrets != nil {
		t.Fatalf("sealed secrets came back on a running job: %v", got.SealedSecrets)
	}

	got.State, got.Status = app.JobEnded, protocol.StatusCanceled
	if err := s.UpdateJob(ctx, got); err != nil {
		t.Fatal(err)
	}
	stale.State = app.JobDispatched
	if err := s.UpdateJob(ctx, stale); !errors.Is(err, app.ErrJobEnded) {
		t.Fatalf("updating an ended job got %v, want ErrJobEnded", err)
	}
	if got, _ = s.GetJob(ctx, "j1"); got.State != app.JobEnded || got.Status != protocol.StatusCanceled {
		t.Fatalf("the ended job became %s %s", got.State, got.Status)
	}

	// A job created past dispatch keeps no sealed secrets either.
	late := newJob("j2", "rte01", t0)
	late.State = app.JobRunning
	late.SealedSecrets = map[string]string{"vault_password": "v1:c2VhbGVk"}
	mustCreate(t, s, late)
	if got, err := s.GetJob(ctx, "j2"); err != nil || got.SealedSecrets != nil {
		t.Fatalf("a job created running kept sealed secrets: %+v (%v)", got, err)
	}
}
