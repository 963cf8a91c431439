package app_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// sharedFile opens n stores on one SQLite file, as n rte-app processes would.
func sharedFile(t *testing.T, n int) (path string, stores []app.Store) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "app.db")
	for range n {
		s, err := sqlitestore.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}
	return path, stores
}

// node is one app node of a test: an App running on its share of the store until stop.
func node(t *testing.T, store app.Store, name string, edit func(*app.Config)) (*testApp, func()) {
	t.Helper()
	ta := runningApp(t, store, func(c *app.Config) {
		c.Node = name
		c.LeasePoll = 20 * time.Millisecond
		if edit != nil {
			edit(c)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ta.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run of %s returned %v, want nil after cancel", name, err)
		}
	}
	t.Cleanup(stop)
	return ta, stop
}

// waitHeldBy waits until ta reports the runner's socket at node (remote or its own).
func waitHeldBy(t *testing.T, ta *testApp, runner, node string, remote bool) {
	t.Helper()
	var st app.RunnerStatus
	var ok bool
	if !testenv.Poll(waitLimit, func() bool {
		st, ok = ta.Status(runner)
		return ok && st.Connected && st.Node == node && st.Remote == remote
	}) {
		t.Fatalf("runner %s: status %+v (ok %v), want connected at %s (remote %v) within %s", runner, st, ok, node, remote, waitLimit)
	}
}

// TestInboundLeaseOneNodeDials: two app nodes on one SQLite file; only the lease holder dials
// the runner, a job submitted on the other runs there, and when the holder stops the other
// takes the lease, dials, and gets the records the first never acked: every record is stored
// once.
func TestInboundLeaseOneNodeDials(t *testing.T) {
	_, stores := sharedFile(t, 2)
	sim := startSim(t, "rte01", 4)
	a, stopA := node(t, stores[0], "app-1", nil)
	a.addSim(t, sim)
	a.waitConnected(t, sim)
	b, _ := node(t, stores[1], "app-2", nil)
	waitHeldBy(t, b, "rte01", "app-1", true)

	j, err := b.Submit(context.Background(), app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	if start := recv(t, sim.Starts(), "job.start from the holder"); start.Job != j.ID {
		t.Fatalf("the runner got job %s, want %s", start.Job, j.ID)
	}
	var want []protocol.Record
	want = append(want, sim.Emit(j.ID, protocol.KindStart, protocol.StartData{PID: 1, Instance: "sim", Playbook: "site.yml"}))
	want = append(want, sim.Emit(j.ID, protocol.KindOutput, output("before\n")))
	a.waitJob(t, j.ID, "two records stored", func(j *app.Job) bool { return j.LastSeq == 2 })

	stopA()
	// Spooled while no node holds the socket; the next node's welcome does not ack them.
	want = append(want, sim.Emit(j.ID, protocol.KindOutput, output("between\n")))
	recv(t, sim.Welcomed(), "socket from the second node")
	waitHeldBy(t, b, "rte01", "app-2", false)
	want = append(want, sim.Emit(j.ID, protocol.KindOutput, output("after\n")))
	want = append(want, sim.Emit(j.ID, protocol.KindEnd, protocol.EndData{Status: protocol.StatusSuccess}))
	end := b.waitJob(t, j.ID, "ended", inState(app.JobEnded))
	if end.Status != protocol.StatusSuccess {
		t.Fatalf("job %+v, want success", end)
	}
	wantRecords(t, b, j.ID, want)

	var nodes []string
	for _, w := range sim.Welcomes() {
		nodes = append(nodes, w.Node)
	}
	if !reflect.DeepEqual(nodes, []string{"app-1", "app-2"}) {
		t.Fatalf("the runner was welcomed by %v, want app-1 then app-2: one node at a time", nodes)
	}
	if n := sim.Offers(j.ID); n != 1 {
		t.Fatalf("the runner got job.start %d times, want once", n)
	}
	sim.NoViolations(t)
}

// TestInboundLeaseTakenAfterExpiry: a node that died leaves its lease in the store; another
// node does not dial the runner while that lease runs, and takes it once it expired.
func TestInboundLeaseTakenAfterExpiry(t *testing.T) {
	store := app.NewMemoryStore()
	clk := newClock()
	ttl := 10 * time.Second
	if _, err := store.ClaimLeases(context.Background(), "app-dead", "dead-instance",
		[]app.LeaseClaim{{Runner: "rte01", Connected: true}}, clk.Now(), clk.Now().Add(ttl)); err != nil {
		t.Fatal(err)
	}
	sim := startSim(t, "rte01", 4)
	b, _ := node(t, store, "app-2", func(c *app.Config) { c.Now, c.LeaseTTL = clk.Now, ttl })
	b.addSim(t, sim)
	// Status reads the lease, so b has claimed, and lost, at least once by now.
	waitHeldBy(t, b, "rte01", "app-dead", true)
	if n := len(sim.Welcomed()); n != 0 {
		t.Fatalf("the runner was dialled %d times while the dead node's lease ran", n)
	}
	clk.Advance(ttl + time.Second)
	recv(t, sim.Welcomed(), "socket once the dead node's lease expired")
	waitHeldBy(t, b, "rte01", "app-2", false)
	welcomes := sim.Welcomes()
	node := welcomes[len(welcomes)-1].Node
	if node != "app-2" {
		t.Fatalf("welcomed by %q, want app-2", node)
	}
}

// TestOutboundAcrossNodes: an outbound RTE holds its socket at node A; what node B does for it
// (a job, a cancel, max_jobs, an approval, a rejection) reaches it through A.
func TestOutboundAcrossNodes(t *testing.T) {
	_, stores := sharedFile(t, 2)
	a, _ := node(t, stores[0], "app-1", nil)
	b, _ := node(t, stores[1], "app-2", nil)
	ctx := context.Background()

	o := joinOut(t, a, "rte-out", testToken, testJoin)
	if w := want[*protocol.Welcome](o); !w.Approved || w.Node != "app-1" {
		t.Fatalf("welcome %+v, want approved by app-1", w)
	}
	waitHeldBy(t, b, "rte-out", "app-1", true)

	submitted := time.Now()
	j, err := b.Submit(ctx, app.JobRequest{Runner: "rte-out", JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	if js := want[*protocol.JobStart](o); js.Job != j.ID {
		t.Fatalf("job.start for %s, want %s", js.Job, j.ID)
	}
	t.Logf("a job submitted on app-2 reached the RTE on app-1 after %s", time.Since(submitted).Round(time.Millisecond))
	o.send(protocol.JobAccepted{Job: j.ID})
	b.waitJob(t, j.ID, "running", inState(app.JobRunning))

	if err := b.Cancel(ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	if c := want[*protocol.JobCancel](o); c.Job != j.ID {
		t.Fatalf("job.cancel for %s, want %s", c.Job, j.ID)
	}
	if err := b.SetMaxJobs(ctx, "rte-out", 3); err != nil {
		t.Fatal(err)
	}
	if s := want[*protocol.Settings](o); s.MaxJobs != 3 {
		t.Fatalf("settings %+v, want max_jobs 3", s)
	}

	// A runner waiting for approval at A is approved at B.
	const otherName = "rte-wait"
	w := joinOut(t, a, otherName, otherToken, "")
	if welcome := want[*protocol.Welcome](w); welcome.Approved {
		t.Fatal("a first join without a join token was approved")
	}
	waitHeldBy(t, b, otherName, "app-1", true)
	if err := b.Approve(ctx, otherName); err != nil {
		t.Fatal(err)
	}
	want[*protocol.Approved](w)
	if err := b.Reject(ctx, otherName, "not ours after all"); err != nil {
		t.Fatal(err)
	}
	if ce := w.closed(); ce.Code != protocol.CloseRejected {
		t.Fatalf("closed with %d %q, want %d", ce.Code, ce.Text, protocol.CloseRejected)
	}
}

// TestSecretsAcrossNodes: with a secret key, a job's secrets submitted on one node reach the
// runner through another, and the store never holds them in clear; without a key, such a
// submit is refused, saying why.
func TestSecretsAcrossNodes(t *testing.T) {
	const key = "app-secret-key-0123456789abcdef0123456789abcdef"
	const secret = "vault-pass-that-must-not-be-on-disk"
	path, stores := sharedFile(t, 3)
	withKey := func(c *app.Config) { c.SecretKey = key }
	a, _ := node(t, stores[0], "app-1", withKey)
	b, _ := node(t, stores[1], "app-2", withKey)
	c, _ := node(t, stores[2], "app-3", nil)
	ctx := context.Background()

	o := joinOut(t, a, "rte-out", testToken, testJoin)
	want[*protocol.Welcome](o)
	waitHeldBy(t, b, "rte-out", "app-1", true)
	waitHeldBy(t, c, "rte-out", "app-1", true)

	j, err := b.Submit(ctx, app.JobRequest{Runner: "rte-out", JobStart: protocol.JobStart{
		Playbook: "site.yml", Secrets: map[string]string{"vault_password": secret}}})
	if err != nil {
		t.Fatal(err)
	}
	js := want[*protocol.JobStart](o)
	plain, err := protocol.OpenSecret(testToken, j.ID, js.Secrets["vault_password"])
	if err != nil || plain != secret {
		t.Fatalf("the runner opened vault_password as %q (%v), want the submitted value", plain, err)
	}
	for _, f := range []string{path, path + "-wal"} {
		raw, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if bytes.Contains(raw, []byte(secret)) {
			t.Fatalf("%s holds the secret in clear", filepath.Base(f))
		}
	}
	o.send(protocol.JobAccepted{Job: j.ID})
	running := b.waitJob(t, j.ID, "running", inState(app.JobRunning))
	if running.SealedSecrets != nil {
		t.Fatal("the sealed secrets stayed in the store after the runner had the job")
	}

	_, err = c.Submit(ctx, app.JobRequest{Runner: "rte-out", JobStart: protocol.JobStart{
		Playbook: "site.yml", Secrets: map[string]string{"vault_password": secret}}})
	if !errors.Is(err, app.ErrRefused) || !containsAll(err.Error(), `app node "app-1"`, "APP_SECRET_KEY") {
		t.Fatalf("a submit with secrets on a node without a key got %v, want a refusal naming app-1 and the secret key", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatal("the refusal shows the secret")
	}
}

// TestSecretsLostAcrossNodes: a job with secrets kept only in the memory of a node that then
// stopped ends, at the node that dispatches it, saying where the secrets were and what to set.
func TestSecretsLostAcrossNodes(t *testing.T) {
	_, stores := sharedFile(t, 2)
	b, stopB := node(t, stores[1], "app-2", nil)
	j, err := b.Submit(context.Background(), app.JobRequest{Runner: "rte-out", JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err == nil || !errors.Is(err, app.ErrNotFound) {
		t.Fatalf("submit for an unknown runner got %v, %v", j, err)
	}
	if err := b.AddRunner(context.Background(), &app.Runner{Name: "rte-out", Mode: protocol.ModeOutbound, Token: testToken}); err != nil {
		t.Fatal(err)
	}
	j, err = b.Submit(context.Background(), app.JobRequest{Runner: "rte-out", JobStart: protocol.JobStart{
		Playbook: "site.yml", Secrets: map[string]string{"become_password": "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	stopB()
	a, _ := node(t, stores[0], "app-1", nil)
	o := joinOut(t, a, "rte-out", testToken, "")
	want[*protocol.Welcome](o)
	end := a.waitJob(t, j.ID, "ended", inState(app.JobEnded))
	if end.Status != protocol.StatusError || !containsAll(end.Message, `app node "app-2"`, "APP_SECRET_KEY", "submit the job again") {
		t.Fatalf("job ended %s %q, want error naming the node that held the secrets and the secret key", end.Status, end.Message)
	}
}

// flakyStore is a store whose leases fail while down is set, as a database that went away.
type flakyStore struct {
	app.Store
	down atomic.Bool
}

var errGone = errors.New("the database server does not answer")

func (s *flakyStore) Leases(ctx context.Context) ([]app.Lease, error) {
	if s.down.Load() {
		return nil, errGone
	}
	return s.Store.Leases(ctx)
}

func (s *flakyStore) ClaimLeases(ctx context.Context, node, instance string, claims []app.LeaseClaim, now, expires time.Time) ([]app.Lease, error) {
	if s.down.Load() {
		return nil, errGone
	}
	return s.Store.ClaimLeases(ctx, node, instance, claims, now, expires)
}

// TestStoreTrouble: StoreTrouble says why the leases cannot be read while the store fails, and
// is nil again once it works.
func TestStoreTrouble(t *testing.T) {
	store := &flakyStore{Store: app.NewMemoryStore()}
	a, _ := node(t, store, "app-1", nil)
	waitTrouble := func(want func(error) bool, what string) {
		t.Helper()
		if !testenv.Poll(waitLimit, func() bool { return want(a.StoreTrouble()) }) {
			t.Fatalf("StoreTrouble is %v, want %s within %s", a.StoreTrouble(), what, waitLimit)
		}
	}
	if err := a.StoreTrouble(); err != nil {
		t.Fatalf("StoreTrouble is %v with a working store, want nil", err)
	}
	store.down.Store(true)
	waitTrouble(func(err error) bool { return errors.Is(err, errGone) && strings.Contains(err.Error(), "leases") }, "the store's error")
	store.down.Store(false)
	waitTrouble(func(err error) bool { return err == nil }, "nil")
}
