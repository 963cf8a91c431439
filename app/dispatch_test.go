package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// ackAfterStore makes the sim check, as each ack arrives, that the store already holds every
// record up to it: the ack must never overtake the commit.
func ackAfterStore(store app.Store) func(protocol.Ack) error {
	return func(a protocol.Ack) error {
		j, err := store.GetJob(context.Background(), a.Job)
		if err != nil {
			return fmt.Errorf("ack for job %s, which the store does not hold: %v", a.Job, err)
		}
		if j.LastSeq < a.Seq {
			return fmt.Errorf("ack %d for job %s arrived while the store holds only up to %d", a.Seq, a.Job, j.LastSeq)
		}
		return nil
	}
}

// cumulative checks that the acks of a job never go back and end at last.
func cumulative(t *testing.T, acks []int64, last int64) {
	t.Helper()
	for i := 1; i < len(acks); i++ {
		if acks[i] < acks[i-1] {
			t.Errorf("acks went back: %v", acks)
			break
		}
	}
	if len(acks) == 0 || acks[len(acks)-1] != last {
		t.Errorf("acks are %v, want them to end at %d", acks, last)
	}
}

// TestJobLifecycle is one job from submit to end on each store: job.start with secrets that
// open with the runner's token, records stored once and in order, acks cumulative and never
// ahead of the store, and the end.
func TestJobLifecycle(t *testing.T) {
	const secret = "vault-pass-do-not-leak"
	for _, impl := range storeImpls {
		t.Run(impl.name, func(t *testing.T) {
			ctx := context.Background()
			store, dir := impl.open(t)
			sim := startSim(t, "rte01", 10)
			sim.checkAck = ackAfterStore(store)
			ta := runningApp(t, store, nil)
			t.Cleanup(func() { assertNoSecretLogged(t, ta.logs, secret) })
			ta.addSim(t, sim)
			ta.start(t)
			ta.waitConnected(t, sim)
			if st, ok := ta.Status("rte01"); !ok || !st.Connected || st.Capacity.MaxJobs != 10 || st.Hello.AnsibleVersion != "2.14.18" || st.Node != testNode {
				t.Errorf("status is %+v (connected %v), want connected with max_jobs 10 from the hello", st, ok)
			}

			j, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{
				Playbook: "site.yml", Inventories: []string{"hosts.yml"}, Forks: 5,
				Secrets: map[string]string{"vault_password": secret}}})
			if err != nil {
				t.Fatal(err)
			}
			if !protocol.ValidJobID(j.ID) || j.Start.Secrets != nil || !reflect.DeepEqual(j.SecretNames, []string{"vault_password"}) {
				t.Fatalf("submitted job is %+v, want an assigned id, no secret values, the secret's name", j)
			}
			start := recv(t, sim.Starts(), "job.start at the runner")
			if start.Job != j.ID || start.Playbook != "site.yml" || start.Forks != 5 {
				t.Errorf("the runner got job.start %+v, want job %s as submitted", start, j.ID)
			}
			if start.Secrets["vault_password"] == secret {
				t.Error("the secret travelled in plaintext")
			}
			opened := sim.Secrets(j.ID)
			if opened["vault_password"] != secret {
				t.Errorf("the runner opened the secrets as %q, want the submitted value", opened)
			}
			ta.waitJob(t, j.ID, "running once accepted", inState(app.JobRunning))

			var want []protocol.Record
			want = append(want, sim.Emit(j.ID, protocol.KindStart, protocol.StartData{PID: 42, Instance: "sim", Playbook: "site.yml"}))
			for i := range 40 {
				want = append(want, sim.Emit(j.ID, protocol.KindOutput, output(fmt.Sprintf("TASK [%d] ok\n", i))))
			}
			end := sim.Emit(j.ID, protocol.KindEnd, protocol.EndData{Status: protocol.StatusFailed, ExitCode: 2, Message: "1 host failed"})
			want = append(want, end)

			got := ta.waitJob(t, j.ID, "ended", inState(app.JobEnded))
			if got.Status != protocol.StatusFailed || got.ExitCode != 2 || got.Message != "1 host failed" ||
				!got.EndedAt.Equal(end.At) || !got.StartedAt.Equal(want[0].At) || got.LastSeq != int64(len(want)) {
				t.Errorf("ended job is %+v, want failed, exit 2, the end's message and times, LastSeq %d", got, len(want))
			}
			wantRecords(t, ta, j.ID, want)
			waitAcked(t, sim, j.ID, int64(len(want)))
			cumulative(t, sim.Acks(j.ID), int64(len(want)))
			sim.NoViolations(t)

			// The secret's plaintext is in no file of the store (the database, its log).
			if dir != "" {
				entries, err := os.ReadDir(dir)
				if err != nil || len(entries) == 0 {
					t.Fatalf("read the store's directory: %v (%d files)", err, len(entries))
				}
				for _, e := range entries {
					b, err := os.ReadFile(filepath.Join(dir, e.Name()))
					if err != nil {
						t.Fatal(err)
					}
					if bytes.Contains(b, []byte(secret)) {
						t.Errorf("the secret's plaintext is in the store's file %s", e.Name())
					}
				}
			}
		})
	}
}

func waitAcked(t *testing.T, sim *simRTE, job string, seq int64) {
	t.Helper()
	if !testenv.Poll(waitLimit, func() bool { return sim.Acked(job) >= seq }) {
		t.Fatalf("job %s: the runner has acks up to %d, want %d within %s", job, sim.Acked(job), seq, waitLimit)
	}
}

// TestDropMidStream cuts the socket while records are in flight and keeps making records while
// it is down: after the reconnect the welcome acks what is stored, the runner resends only the
// rest, and every record is stored exactly once.
func TestDropMidStream(t *testing.T) {
	for _, impl := range storeImpls {
		t.Run(impl.name, func(t *testing.T) {
			ctx := context.Background()
			store, _ := impl.open(t)
			sim := startSim(t, "rte01", 10)
			sim.checkAck = ackAfterStore(store)
			ta := runningApp(t, store, nil)
			ta.addSim(t, sim)
			ta.start(t)
			ta.waitConnected(t, sim)
			j, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Playbook: "site.yml"}})
			if err != nil {
				t.Fatal(err)
			}
			recv(t, sim.Starts(), "job.start")

			var want []protocol.Record
			for i := range 20 {
				want = append(want, sim.Emit(j.ID, protocol.KindOutput, output(fmt.Sprintf("before %d", i))))
			}
			waitAcked(t, sim, j.ID, 20)
			for i := range 200 { // in flight when the socket drops
				want = append(want, sim.Emit(j.ID, protocol.KindOutput, output(fmt.Sprintf("in flight %d %s", i, strings.Repeat("x", 512)))))
			}
			sim.Drop()
			for i := range 20 { // spooled while down
				want = append(want, sim.Emit(j.ID, protocol.KindOutput, output(fmt.Sprintf("while down %d", i))))
			}
			ta.waitConnected(t, sim)
			want = append(want, sim.Emit(j.ID, protocol.KindEnd, protocol.EndData{Status: protocol.StatusSuccess}))

			got := ta.waitJob(t, j.ID, "ended", inState(app.JobEnded))
			if got.Status != protocol.StatusSuccess || got.LastSeq != int64(len(want)) {
				t.Errorf("job ended %s with LastSeq %d, want success and %d", got.Status, got.LastSeq, len(want))
			}
			wantRecords(t, ta, j.ID, want)
			waitAcked(t, sim, j.ID, int64(len(want)))
			sim.NoViolations(t)

			welcomes, resent := sim.Welcomes(), sim.Resent()
			if len(welcomes) != 2 {
				t.Fatalf("the runner saw %d welcomes, want 2 (connect, reconnect)", len(welcomes))
			}
			acked := welcomes[1].Acked[j.ID]
			if acked < 20 || int(acked) > len(want)-1 {
				t.Errorf("the reconnect's welcome acked %d, want at least the 20 acked before the drop", acked)
			}
			t.Logf("welcome acked %d of %d records; the runner resent %d", acked, len(want)-1, resent)
			if wantResent := len(want) - 1 - int(acked); resent != wantResent {
				t.Errorf("the runner resent %d records, want %d: exactly those above the welcome's ack %d", resent, wantResent, acked)
			}
		})
	}
}

// TestRefusedFullWaitsForCapacity: a runner that refuses a job as full keeps it queued, gets
// nothing more until it reports capacity, then gets the waiting jobs.
func TestRefusedFullWaitsForCapacity(t *testing.T) {
	ctx := context.Background()
	store := app.NewMemoryStore()
	sim := startSim(t, "rte01", 10)
	refusedOnce := false
	sim.refuse = func(s protocol.JobStart) string {
		if !refusedOnce { // called from the sim's one reader goroutine
			refusedOnce = true
			return protocol.RefusedFull
		}
		return ""
	}
	ta := runningApp(t, store, nil)
	ta.addSim(t, sim)
	ta.start(t)
	ta.waitConnected(t, sim)

	j1, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Job: "j1", Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, sim.Refusals(), "refusal")
	got := ta.waitJob(t, j1.ID, "queued again after the refusal", func(j *app.Job) bool {
		return j.State == app.JobQueued && strings.Contains(j.Message, "(full: the sim refuses: full)")
	})
	if !got.DispatchedAt.IsZero() {
		t.Errorf("refused job keeps DispatchedAt %s, want zero", got.DispatchedAt)
	}
	// A new job wakes dispatch; the runner said it is full, so neither job goes out.
	j2, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Job: "j2", Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	ta.waitJob(t, j2.ID, "held back until the runner reports capacity", func(j *app.Job) bool {
		return j.State == app.JobQueued && strings.Contains(j.Message, "waiting for it to report free capacity")
	})
	if n := sim.Offers("j1"); n != 1 {
		t.Fatalf("j1 was offered %d times before the runner reported capacity, want 1", n)
	}

	if err := sim.Send(protocol.Capacity{Running: 0, MaxJobs: 10}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		recv(t, sim.Starts(), "job.start after capacity")
	}
	ta.waitJob(t, "j1", "running", inState(app.JobRunning))
	ta.waitJob(t, "j2", "running", inState(app.JobRunning))
	if n := sim.Offers("j1"); n != 2 {
		t.Errorf("j1 was offered %d times, want 2", n)
	}
	if st, _ := ta.Status("rte01"); st.Capacity != (protocol.Capacity{MaxJobs: 10}) {
		t.Errorf("status capacity is %+v, want the runner's last report", st.Capacity)
	}
	sim.NoViolations(t)
}

// TestMaxJobsBoundsDispatch: with max_jobs 1 the second job waits until the first one's end.
func TestMaxJobsBoundsDispatch(t *testing.T) {
	ctx := context.Background()
	sim := startSim(t, "rte01", 1)
	ta := runningApp(t, app.NewMemoryStore(), nil)
	ta.addSim(t, sim)
	ta.start(t)
	ta.waitConnected(t, sim)
	for _, id := range []string{"first", "second"} {
		if _, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Job: id, Playbook: "site.yml"}}); err != nil {
			t.Fatal(err)
		}
	}
	if s := recv(t, sim.Starts(), "first job.start"); s.Job != "first" {
		t.Fatalf("the runner got %s first, want the older job", s.Job)
	}
	ta.waitJob(t, "second", "waiting for a slot", func(j *app.Job) bool {
		return j.State == app.JobQueued && strings.Contains(j.Message, "no free slot (max_jobs 1)")
	})
	sim.Emit("first", protocol.KindEnd, protocol.EndData{Status: protocol.StatusSuccess})
	if s := recv(t, sim.Starts(), "second job.start"); s.Job != "second" {
		t.Fatalf("the runner got %s, want the second job", s.Job)
	}
	sim.NoViolations(t)
}

func TestRefusedForGoodEndsAtOnce(t *testing.T) {
	ctx := context.Background()
	sim := startSim(t, "rte01", 10)
	sim.refuse = func(s protocol.JobStart) string { return s.Job } // the job id is the code
	ta := runningApp(t, app.NewMemoryStore(), nil)
	ta.addSim(t, sim)
	ta.start(t)
	ta.waitConnected(t, sim)
	for _, code := range []string{protocol.RefusedInvalid, protocol.RefusedNotApproved, protocol.RefusedFilesTooLarge} {
		t.Run(code, func(t *testing.T) {
			if _, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Job: code, Playbook: "site.yml"}}); err != nil {
				t.Fatal(err)
			}
			got := ta.waitJob(t, code, "ended", inState(app.JobEnded))
			if got.Status != protocol.StatusError || !containsAll(got.Message, "refused the job ("+code+")", "the sim refuses") {
				t.Errorf("job ended %s with %q, want error naming the code and the runner's message", got.Status, got.Message)
			}
		})
	}
}

// TestQueueTimeout ends jobs that could not be dispatched in time, saying why: one whose runner
// never connected, one whose runner had no free slot.
func TestQueueTimeout(t *testing.T) {
	ctx := context.Background()
	sim := startSim(t, "busy", 1)
	ta := runningApp(t, app.NewMemoryStore(), func(c *app.Config) { c.QueueTimeout = time.Hour })
	ta.addSim(t, sim)
	// A port nobody listens on: the dial fails, and the runner stays unconnected.
	gone := startSim(t, "gone", 1)
	goneURL := gone.url()
	gone.Close()
	if err := ta.AddRunner(ctx, &app.Runner{Name: "gone", URL: goneURL, Token: testToken, Certificate: gone.cert.der}); err != nil {
		t.Fatal(err)
	}
	ta.start(t)
	ta.waitConnected(t, sim)

	submit := func(runner, id string) {
		t.Helper()
		if _, err := ta.Submit(ctx, app.JobRequest{Runner: runner, JobStart: protocol.JobStart{Job: id, Playbook: "site.yml"}}); err != nil {
			t.Fatal(err)
		}
	}
	submit("busy", "running")
	recv(t, sim.Starts(), "job.start")
	submit("busy", "no-slot")
	submit("gone", "no-runner")
	ta.waitJob(t, "no-slot", "waiting for a slot", func(j *app.Job) bool { return strings.Contains(j.Message, "no free slot") })

	ta.clock.Advance(time.Hour + time.Second)
	for id, why := range map[string]string{"no-slot": `runner "busy" has no free slot`, "no-runner": `runner "gone" was not connected`} {
		got := ta.waitJob(t, id, "ended by the queue timeout", inState(app.JobEnded))
		if got.Status != protocol.StatusError || !containsAll(got.Message, "never started", "queue timeout of 1h0m0s", why) || !got.EndedAt.Equal(ta.clock.Now()) {
			t.Errorf("job %s ended %s at %s with %q, want error now, naming the timeout and %q", id, got.Status, got.EndedAt, got.Message, why)
		}
	}
	if j, _ := ta.GetJob(ctx, "running"); j.State != app.JobRunning {
		t.Errorf("the running job is %s after the queue timeout, want running: the timeout is for queued jobs", j.State)
	}
}

func TestCancel(t *testing.T) {
	ctx := context.Background()
	sim := startSim(t, "rte01", 10)
	ta := runningApp(t, app.NewMemoryStore(), nil)
	ta.addSim(t, sim)
	if err := ta.AddRunner(ctx, &app.Runner{Name: "offline", URL: "https://127.0.0.1:1", Token: testToken, Certificate: sim.cert.der}); err != nil {
		t.Fatal(err)
	}
	ta.start(t)
	ta.waitConnected(t, sim)

	t.Run("queued", func(t *testing.T) {
		j, err := ta.Submit(ctx, app.JobRequest{Runner: "offline", JobStart: protocol.JobStart{Playbook: "site.yml",
			Secrets: map[string]string{"become_password": "pw-0123456789"}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := ta.Cancel(ctx, j.ID); err != nil {
			t.Fatal(err)
		}
		got, err := ta.GetJob(ctx, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != app.JobEnded || got.Status != protocol.StatusCanceled || !strings.Contains(got.Message, "before it was dispatched") {
			t.Errorf("canceled queued job is %s/%s %q, want ended canceled at once", got.State, got.Status, got.Message)
		}
		if err := ta.Cancel(ctx, j.ID); !errors.Is(err, app.ErrJobEnded) {
			t.Errorf("canceling an ended job got %v, want ErrJobEnded", err)
		}
	})

	t.Run("running", func(t *testing.T) {
		j, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Playbook: "site.yml"}})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, sim.Starts(), "job.start")
		ta.waitJob(t, j.ID, "running", inState(app.JobRunning))
		sim.Emit(j.ID, protocol.KindStart, protocol.StartData{PID: 1})
		if err := ta.Cancel(ctx, j.ID); err != nil {
			t.Fatal(err)
		}
		if got := recv(t, sim.Cancels(), "job.cancel at the runner"); got != j.ID {
			t.Fatalf("the runner got job.cancel for %s, want %s", got, j.ID)
		}
		if got, _ := ta.GetJob(ctx, j.ID); got.State != app.JobRunning || !got.CancelRequested {
			t.Errorf("job is %s, cancel requested %v; want running until the runner's end, with the request kept", got.State, got.CancelRequested)
		}
		sim.Emit(j.ID, protocol.KindEnd, protocol.EndData{Status: protocol.StatusCanceled, ExitCode: -15, Message: "canceled by the app"})
		got := ta.waitJob(t, j.ID, "ended", inState(app.JobEnded))
		if got.Status != protocol.StatusCanceled || got.LastSeq != 2 {
			t.Errorf("job ended %s with LastSeq %d, want canceled and 2", got.Status, got.LastSeq)
		}
	})
	if _, err := ta.GetJob(ctx, "nope"); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("get unknown job got %v, want ErrNotFound", err)
	}
	if err := ta.Cancel(ctx, "nope"); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("cancel unknown job got %v, want ErrNotFound", err)
	}
	sim.NoViolations(t)
}

// TestConnectReconciles starts an App on a store left by an earlier one, against a runner
// that holds some of the jobs: each job ends up where the rules of reconcile put it.
func TestConnectReconciles(t *testing.T) {
	ctx := context.Background()
	store := app.NewMemoryStore()
	sim := startSim(t, "rte01", 10)
	now := newClock().Now()
	put := func(id string, state app.JobState, secrets ...string) {
		t.Helper()
		j := &app.Job{ID: id, Runner: "rte01", State: state, CreatedAt: now, SecretNames: secrets,
			Start: protocol.JobStart{Job: id, Playbook: "site.yml"}}
		if err := store.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	put("lost-start", app.JobDispatched)                     // job.start lost: sent again
	put("lost-secrets", app.JobDispatched, "vault_password") // secrets gone with the restart
	put("held", app.JobDispatched)                           // the runner has it: running, not sent again
	put("forgotten", app.JobRunning)                         // the runner restarted before its start: abandoned
	put("spool-lost", app.JobRunning)                        // records 1..2 stored, the runner has none: abandoned
	put("spooled", app.JobRunning)                           // records 1..3 stored, 4..5 at the runner
	put("queued-secrets", app.JobQueued, "become_password")  // secrets gone: ended at Run
	put("canceled-in-flight", app.JobDispatched)             // cancel requested, never arrived: canceled
	j, _ := store.GetJob(ctx, "canceled-in-flight")
	j.CancelRequested = true
	if err := store.UpdateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	var spooled []protocol.Record
	sim.Adopt("held")
	for i := range 5 {
		spooled = append(spooled, sim.Emit("spooled", protocol.KindOutput, output(fmt.Sprintf("line %d", i))))
	}
	if _, err := store.StoreRecords(ctx, spooled[:3]); err != nil {
		t.Fatal(err)
	}
	if _, err := store.StoreRecords(ctx, []protocol.Record{
		{Job: "spool-lost", Seq: 1, Kind: protocol.KindStart, At: now, Data: json.RawMessage(`{"pid":1,"instance":"h","playbook":"site.yml"}`)},
		{Job: "spool-lost", Seq: 2, Kind: protocol.KindOutput, At: now, Data: json.RawMessage(`{"text":"x"}`)},
	}); err != nil {
		t.Fatal(err)
	}

	ta := runningApp(t, store, nil)
	ta.addSim(t, sim)
	ta.start(t)
	ta.waitConnected(t, sim)

	if s := recv(t, sim.Starts(), "job.start sent again"); s.Job != "lost-start" {
		t.Errorf("the runner got job.start for %s, want lost-start", s.Job)
	}
	for id, want := range map[string]struct{ status, says string }{
		"lost-secrets":       {protocol.StatusError, "app restarted before the runner had the job"},
		"queued-secrets":     {protocol.StatusError, "app restarted before the runner had the job"},
		"forgotten":          {protocol.StatusAbandoned, "restarted after accepting the job and before starting it"},
		"spool-lost":         {protocol.StatusAbandoned, "records after seq 2 never arrived"},
		"canceled-in-flight": {protocol.StatusCanceled, "before the runner started it"},
	} {
		got := ta.waitJob(t, id, "ended", inState(app.JobEnded))
		if got.Status != want.status || !strings.Contains(got.Message, want.says) {
			t.Errorf("job %s ended %s with %q, want %s saying %q", id, got.Status, got.Message, want.status, want.says)
		}
	}
	ta.waitJob(t, "held", "running", inState(app.JobRunning))
	ta.waitJob(t, "lost-start", "running", inState(app.JobRunning))
	ta.waitJob(t, "spooled", "all five records", func(j *app.Job) bool { return j.LastSeq == 5 })
	wantRecords(t, ta, "spooled", spooled)
	welcome, resent := sim.Welcomes()[0], sim.Resent()
	if !reflect.DeepEqual(welcome.Acked, map[string]int64{"spooled": 3}) || resent != 2 {
		t.Errorf("welcome acked %v and the runner resent %d records, want spooled:3 and 2", welcome.Acked, resent)
	}
	if n := sim.Offers("held"); n != 0 {
		t.Errorf("the job the runner holds was offered %d times, want 0", n)
	}
	sim.NoViolations(t)
}

// TestRecordsOfOtherJobsRefused: records for a job the app does not know, or gave to another
// runner, are answered with an error and neither stored nor acked.
func TestRecordsOfOtherJobsRefused(t *testing.T) {
	ctx := context.Background()
	store := app.NewMemoryStore()
	if err := store.CreateJob(ctx, &app.Job{ID: "theirs", Runner: "rte02", State: app.JobRunning, Start: protocol.JobStart{Job: "theirs", Playbook: "p"}}); err != nil {
		t.Fatal(err)
	}
	sim := startSim(t, "rte01", 10)
	ta := runningApp(t, store, nil)
	ta.addSim(t, sim)
	ta.start(t)
	ta.waitConnected(t, sim)
	mine, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, sim.Starts(), "job.start")
	for _, id := range []string{"theirs", "ghost"} {
		sim.Emit(id, protocol.KindOutput, output("forged"))
		sim.Emit(id, protocol.KindOutput, output("forged again"))
		e := recv(t, sim.Errors(), "error for job "+id)
		if e.Ref != id || e.Code != protocol.ErrUnexpected {
			t.Errorf("the runner got %+v, want an unexpected error with ref %s", e, id)
		}
	}
	sim.Emit(mine.ID, protocol.KindOutput, output("real"))
	waitAcked(t, sim, mine.ID, 1)
	if recs, _ := store.Records(ctx, "theirs", 0, 0); len(recs) != 0 {
		t.Errorf("another runner's job has %d records stored, want 0", len(recs))
	}
	if a := append(sim.Acks("theirs"), sim.Acks("ghost")...); len(a) != 0 {
		t.Errorf("forged records were acked: %v", a)
	}
	select {
	case e := <-sim.Errors():
		t.Errorf("a second error %+v for the same job on one socket, want one", e)
	default:
	}
}

// TestWaitingRunnerNotDialled: a runner that registered waits for approval without being
// dialled, is dialled once approved, and loses its socket when rejected.
func TestWaitingRunnerNotDialled(t *testing.T) {
	ctx := context.Background()
	sim := startSim(t, "rte01", 10)
	ta := runningApp(t, app.NewMemoryStore(), nil)
	ta.start(t)
	code, _ := ta.register(t, protocol.RegisterRequest{Name: "rte01", URL: sim.url(), Token: testToken, Certificate: sim.cert.pem, Version: "1.2.3"})
	if code != 202 {
		t.Fatalf("registration answered %d, want 202", code)
	}
	if _, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Playbook: "p"}}); err == nil || !strings.Contains(err.Error(), "not approved") {
		t.Errorf("submit to a waiting runner got %v, want a refusal saying it is not approved", err)
	}
	// Run polls every 20ms; a few polls pass while the runner waits.
	time.Sleep(100 * time.Millisecond)
	n := sim.Sockets()
	if n != 0 {
		t.Fatalf("the app dialled a runner waiting for approval (%d sockets)", n)
	}
	if err := ta.Approve(ctx, "rte01"); err != nil {
		t.Fatal(err)
	}
	ta.waitConnected(t, sim)

	// Rejected while connected: the socket is closed and not dialled again.
	if err := ta.Reject(ctx, "rte01", "test"); err != nil {
		t.Fatal(err)
	}
	if !testenv.Poll(waitLimit, func() bool { _, ok := ta.Status("rte01"); return !ok }) {
		t.Fatalf("the app still holds a socket to a rejected runner after %s", waitLimit)
	}
}

func TestSubmitRefusals(t *testing.T) {
	ctx := context.Background()
	ta := newTestApp(t, nil)
	if err := ta.AddRunner(ctx, &app.Runner{Name: "rte01", URL: "https://127.0.0.1:1", Token: testToken}); err != nil {
		t.Fatal(err)
	}
	transfer := ta.runner(t, "rte01")
	transfer.Name, transfer.Files = "transfer", protocol.FilesTransfer
	waiting := ta.runner(t, "rte01")
	waiting.Name, waiting.State = "waiting", app.StateWaiting
	for _, r := range []*app.Runner{transfer, waiting} {
		if err := ta.store.PutRunner(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ta.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Job: "taken", Playbook: "p"}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  app.JobRequest
		says string
		is   error
	}{
		{"unknown runner", app.JobRequest{Runner: "nobody", JobStart: protocol.JobStart{Playbook: "p"}}, "not found", app.ErrNotFound},
		{"waiting runner", app.JobRequest{Runner: "waiting", JobStart: protocol.JobStart{Playbook: "p"}}, "not approved", nil},
		{"bad job id", app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Job: "a/b", Playbook: "p"}}, "job:", nil},
		{"no playbook", app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{}}, "playbook", nil},
		{"unknown secret", app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Playbook: "p", Secrets: map[string]string{"ssh_key": "x"}}}, "secrets", nil},
		{"extravars not an object", app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Playbook: "p", Extravars: []byte(`[1]`)}}, "extravars", nil},
		{"transfer runner without files", app.JobRequest{Runner: "transfer", JobStart: protocol.JobStart{Playbook: "p"}}, "RTE_FILES=transfer", nil},
		{"taken id", app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Job: "taken", Playbook: "p"}}, "already exists", app.ErrExists},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ta.Submit(ctx, tt.req)
			if err == nil || !strings.Contains(err.Error(), tt.says) || (tt.is != nil && !errors.Is(err, tt.is)) {
				t.Errorf("submit got %v, want an error saying %q", err, tt.says)
			}
		})
	}
}

func TestSetMaxJobs(t *testing.T) {
	ctx := context.Background()
	sim := startSim(t, "rte01", 10)
	ta := runningApp(t, app.NewMemoryStore(), nil)
	ta.addSim(t, sim)
	ta.start(t)
	ta.waitConnected(t, sim)
	if err := ta.SetMaxJobs(ctx, "rte01", 3); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, sim.Settings(), "settings at the runner"); got.MaxJobs != 3 {
		t.Errorf("the runner got settings %+v, want max_jobs 3", got)
	}
	if r := ta.runner(t, "rte01"); r.MaxJobs != 3 {
		t.Errorf("stored max jobs is %d, want 3: the next welcome carries it", r.MaxJobs)
	}
	if err := ta.SetMaxJobs(ctx, "rte01", -1); err == nil {
		t.Error("a negative max jobs was accepted")
	}
	if err := ta.SetMaxJobs(ctx, "nobody", 1); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("set max jobs of an unknown runner got %v, want ErrNotFound", err)
	}
}
