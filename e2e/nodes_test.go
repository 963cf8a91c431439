package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// addNode starts another app node on the rig's SQLite file, as a second rte-app process would:
// its own store handle, its own listener, the rig's config under another node name (edits
// change it further). It returns the rig as that node sees it: the same RTE and runner, this
// node's App and store.
func (r *jobRig) addNode(name string, edits ...func(*app.Config)) *jobRig {
	r.t.Helper()
	side := startAppSide(r.t, onSQLite(r.side.DBPath), fromConfig(r.side.Config), served(), running(),
		withAppConfig(func(c *app.Config) { c.Node = name }), withAppConfig(edits...))
	return &jobRig{t: r.t, App: side.App, Store: side.Store, RTE: r.RTE, Proxy: r.Proxy, Name: r.Name, dir: r.dir, env: r.env, side: side}
}

// StopNode stops the node as an operator stopping rte-app would: its Run ends (closing its
// sockets and freeing its leases), and its listener closes.
func (r *jobRig) StopNode() {
	r.Stop()
	r.side.srv.Close()
}

// waitHolder waits until the rig's App reports the runner's socket at node.
func (r *jobRig) waitHolder(node string, timeout time.Duration) {
	r.t.Helper()
	var st app.RunnerStatus
	if !testenv.Poll(timeout, func() bool {
		var ok bool
		st, ok = r.App.Status(r.Name)
		return ok && st.Connected && st.Node == node
	}) {
		r.t.Fatalf("runner %s: status %+v, want its socket held by %s within %s", r.Name, st, node, timeout)
	}
}

// welcomedBy lists the app node of every welcome the RTE logged after mark, in order.
func welcomedBy(rte *rteProc, mark int) []string {
	var nodes []string
	for _, l := range rte.Lines(mark) {
		if l["msg"] == "welcomed" {
			n, _ := l["node"].(string)
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// TestNodesInboundTakeover: two app nodes share one SQLite file. Node app-1 holds the inbound
// RTE's socket; a job printing many lines is submitted on app-2 and runs through app-1; app-1
// stops mid-job; app-2 takes the lease, dials within a few seconds, the RTE resends what it
// spooled meanwhile, and every line is stored exactly once.
func TestNodesInboundTakeover(t *testing.T) {
	a := newJobRig(t)
	b := a.addNode("app-2")
	b.waitHolder("app-1", 30*time.Second)

	const lines = 20000
	j := b.submit(protocol.JobStart{Playbook: "lines.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(fmt.Sprintf(`{"lines":%d,"batches":10,"pause":1}`, lines))})
	a.waitState(j.ID, app.JobRunning, time.Minute)
	testenv.Poll(time.Minute, func() bool { return len(a.records(j.ID)) >= 3 })
	if got := welcomedBy(a.RTE, 0); strings.Join(got, ",") != "app-1" {
		t.Fatalf("before the stop the RTE was welcomed by %v, want app-1 alone: one node holds the socket", got)
	}

	mark := a.RTE.Mark()
	// The way from app-2 to the RTE stays shut for a moment after app-1 stops, so the job
	// prints into the spool while no node holds the socket, and the RTE has records to resend.
	a.Proxy.Refuse(true)
	stopped := time.Now()
	a.StopNode()
	time.Sleep(2 * time.Second)
	opened := time.Now()
	a.Proxy.Refuse(false)
	a.RTE.WaitLogMatch(mark, "welcomed", 30*time.Second, func(l map[string]any) bool { return l["node"] == "app-2" })
	t.Logf("app-2 was welcomed by the RTE %s after app-1 stopped (%s after the way to the RTE opened again)",
		time.Since(stopped).Round(time.Millisecond), time.Since(opened).Round(time.Millisecond))
	b.waitHolder("app-2", 30*time.Second)

	end := b.waitEnd(j.ID, 3*time.Minute)
	if end.Status != protocol.StatusSuccess {
		t.Fatalf("job %+v, want success", end)
	}
	s := b.story(j.ID)
	checkLines(t, s.Output, lines)
	if got := welcomedBy(a.RTE, mark); strings.Join(got, ",") != "app-2" {
		t.Fatalf("after the stop the RTE was welcomed by %v, want app-2 alone", got)
	}
	resent := 0
	for _, l := range a.RTE.Lines(mark) {
		if l["msg"] == "resent spooled records" {
			resent++
		}
	}
	if resent == 0 {
		t.Fatal("the RTE resent nothing to app-2, though the job printed while no node held its socket")
	}
	t.Logf("%d records, %d bytes of output stored once each across the takeover", len(s.Records), len(s.Output))
	noRace(t, a.RTE)
}

// TestNodesOutboundSubmitElsewhere: an outbound RTE holds its socket at app-1; a job submitted
// at app-2 reaches it through app-1 and runs.
func TestNodesOutboundSubmitElsewhere(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "app.db")
	a := newOutboundApp(t, dbPath)
	b := newOutboundApp(t, dbPath, func(c *app.Config) { c.Node = "app-2" })
	srvA, srvB := httptest.NewServer(a), httptest.NewServer(b)
	t.Cleanup(srvA.Close)
	t.Cleanup(srvB.Close)
	const name = "rte-nodes"
	rte := startRTE(t, t.TempDir(), freePort(t), outboundEnv(srvA.URL, name, "RTE_JOIN_TOKEN="+joinToken)...)
	rte.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(true))
	jb := b.rig(rte, name)
	jb.waitHolder("app-1", 30*time.Second)

	j := jb.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(`{"who":"another node"}`)})
	running := jb.waitState(j.ID, app.JobRunning, 30*time.Second)
	t.Logf("submitted at app-2, dispatched by app-1 %s later (the two nodes' clocks are this machine's)",
		running.DispatchedAt.Sub(running.CreatedAt).Round(time.Millisecond))
	end := jb.waitEnd(j.ID, 2*time.Minute)
	s := jb.story(j.ID)
	if end.Status != protocol.StatusSuccess || !strings.Contains(s.Output, "hello another node") {
		t.Fatalf("job %+v with output:\n%s\nwant success saying hello another node", end, s.Output)
	}
	if got := welcomedBy(rte, 0); strings.Join(got, ",") != "app-1" {
		t.Fatalf("the RTE was welcomed by %v, want app-1 alone", got)
	}
	noRace(t, rte)
}

// observed tees the app's log into an observer, to find a line the app must write.
func observed(t *testing.T) (func(*app.Config), *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	return func(c *app.Config) {
		c.Logger = zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	}, logs
}

// TestNodesDatabaseModeMove: a real outbound RTE signs in with the name and token of a runner
// still in database mode; the app moves the runner to outbound by itself, and the RTE runs a job.
func TestNodesDatabaseModeMove(t *testing.T) {
	withLogs, logs := observed(t)
	oa := newOutboundApp(t, "", withLogs)
	const name = "rte-was-db"
	if err := oa.App.AddRunner(context.Background(), &app.Runner{Name: name, Mode: app.ModeDatabase, Token: outboundToken(name)}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(oa)
	t.Cleanup(srv.Close)
	rte := startRTE(t, t.TempDir(), freePort(t), outboundEnv(srv.URL, name)...)
	rte.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(true))
	if r := oa.waitRunner(name, app.StateApproved); r.Mode != protocol.ModeOutbound {
		t.Fatalf("runner mode %s after its RTE signed in, want outbound", r.Mode)
	}
	const msg = "Runner '" + name + "' moved from database mode to outbound: its RTE signed in with the runner's own token."
	if n := logs.FilterMessage(msg).Len(); n != 1 {
		t.Fatalf("the app logged %q %d times, want once", msg, n)
	}
	jr := oa.rig(rte, name)
	j := jr.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"}})
	if end := jr.waitEnd(j.ID, 2*time.Minute); end.Status != protocol.StatusSuccess {
		t.Fatalf("job %+v, want success", end)
	}
	noRace(t, rte)
}

// TestNodesSeedKeepsDatabaseMode: a runner the config seed keeps in database mode refuses its
// real RTE with a 403 that names the seed file, which the RTE logs; once the seed says outbound,
// the restarted RTE is taken, the app still running.
func TestNodesSeedKeepsDatabaseMode(t *testing.T) {
	const name = "rte-seeded"
	seedPath := filepath.Join(t.TempDir(), "seed.yml")
	writeSeed := func(mode string) {
		t.Helper()
		text := fmt.Sprintf("runners:\n  - name: %s\n    rte_mode: %s\n    token: ${E2E_SEEDED_TOKEN}\n", name, mode)
		if err := os.WriteFile(seedPath, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeSeed("database")
	lookup := func(k string) (string, bool) {
		if k == "E2E_SEEDED_TOKEN" {
			return outboundToken(name), true
		}
		return "", false
	}
	oa := newOutboundApp(t, "", func(c *app.Config) {
		c.Seed = func() (*app.Seed, error) { return app.LoadSeed(seedPath, lookup) }
	})
	if err := oa.App.ApplySeed(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(oa)
	t.Cleanup(srv.Close)
	env := outboundEnv(srv.URL, name)
	dir := t.TempDir()
	rte := startRTE(t, dir, freePort(t), env...)
	line := rte.WaitLog("the app refused this runner", 30*time.Second)
	want := "runner '" + name + "' is managed by the config seed in database mode: set rte_mode: outbound for it in the seed (" + seedPath + "), then restart this RTE"
	if e, _ := line["error"].(string); !strings.Contains(e, "403") || !strings.Contains(e, want) {
		t.Fatalf("the RTE logged the refusal with error %q, want the 403 and %q", e, want)
	}
	if r, _ := oa.Store.GetRunner(context.Background(), name); r.Mode != app.ModeDatabase {
		t.Fatalf("the refused runner is %s, want still database", r.Mode)
	}

	writeSeed("outbound")
	rte.Kill()
	rte = startRTE(t, dir, freePort(t), env...)
	rte.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(true))
	if r := oa.waitRunner(name, app.StateApproved); r.Mode != protocol.ModeOutbound || !r.Seeded {
		t.Fatalf("runner after the seed changed: mode %s, seeded %v; want outbound and seeded", r.Mode, r.Seeded)
	}
	noRace(t, rte)
}

// refAppPID finds the rte-app process started with APP_NODE=node (the reference app's own
// helper keeps no handle on it).
func refAppPID(t *testing.T, node string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if strings.Contains(string(cmdline), "rte-app") && slices.Contains(strings.Split(string(environ), "\x00"), "APP_NODE="+node) {
			return pid
		}
	}
	t.Fatalf("no rte-app process with APP_NODE=%s", node)
	return 0
}

// runnerOn asks the reference app which node holds the runner's socket ("" while none does).
func runnerOn(t *testing.T, ref *refApp, name string) string {
	t.Helper()
	status, body := ref.call(t, http.MethodGet, "/api/v2/runners", "")
	if status != http.StatusOK {
		return ""
	}
	var ans struct {
		Runners []struct {
			Name      string `json:"name"`
			Connected bool   `json:"connected"`
			Node      string `json:"node"`
		} `json:"runners"`
	}
	mustJSON(t, body, &ans)
	for _, r := range ans.Runners {
		if r.Name == name && r.Connected {
			return r.Node
		}
	}
	return ""
}

// TestNodesServeKilled: two `rte-app serve` processes on one SQLite file. The one holding the
// inbound RTE's socket is killed (SIGKILL, so it frees nothing) while a job prints; the other
// takes the lease once it expires, dials, the RTE resends, and the job's output is stored once.
func TestNodesServeKilled(t *testing.T) { nodesServeKilled(t, filepath.Join(t.TempDir(), "app.db")) }

// nodesServeKilled is TestNodesServeKilled on the store APP_DB names (a file or a URL).
func nodesServeKilled(t *testing.T, db string) {
	a := startRefApp(t, "APP_DB="+db, "APP_NODE=e2e-node-a", "RTE_JOIN_TOKEN="+joinToken)
	b := startRefApp(t, "APP_DB="+db, "APP_NODE=e2e-node-b", "RTE_JOIN_TOKEN="+joinToken)
	nodesTakeover(t, a, b, "killed", func(victim string) { _ = syscall.Kill(-refAppPID(t, victim), syscall.SIGKILL) })
}

// nodesTakeover has a and b (APP_NODE e2e-node-a and e2e-node-b) share an inbound RTE while a
// job prints, does fault to the node holding its socket, and checks that the other took over
// and that the job's output was stored once.
func nodesTakeover(t *testing.T, a, b *refApp, what string, fault func(victim string)) {
	const name = "rte-serve-killed"
	testdata, _ := filepath.Abs("testdata")
	port := freePort(t)
	rte := startRTE(t, t.TempDir(), port, "HTTPS=1", "RTE_TOKEN="+testToken, "RTE_NAME="+name,
		"RTE_JOIN_TOKEN="+joinToken, "APP_URL="+a.url, fmt.Sprintf("RTE_URL=https://127.0.0.1:%d", port),
		"RTE_FILES=local", "ANSIBLE_PATH="+filepath.Join(testdata, "playbooks"),
		"REPO_PATH="+filepath.Join(testdata, "inventory"), "RTE_DRAIN_SECONDS=2")
	rte.WaitLog("welcomed", time.Minute)
	holder := welcomedBy(rte, 0)[0]
	survivor, victim := b, "e2e-node-a"
	if holder == "e2e-node-b" {
		survivor, victim = a, "e2e-node-b"
	}
	if !testenv.Poll(30*time.Second, func() bool { return runnerOn(t, survivor, name) == holder }) {
		t.Fatalf("the surviving node does not show the runner's socket at %s", holder)
	}

	const lines = 25000
	status, body := survivor.call(t, http.MethodPost, "/api/v2/jobs", fmt.Sprintf(
		`{"runner":%q,"playbook":"lines.yml","inventories":["local.ini"],"extravars":{"lines":%d,"batches":25,"pause":1}}`, name, lines))
	if status != http.StatusCreated {
		t.Fatalf("submit: %d %s", status, body)
	}
	var job struct {
		ID     string `json:"id"`
		State  string `json:"state"`
		Status string `json:"status"`
	}
	mustJSON(t, body, &job)
	readJob := func() {
		t.Helper()
		status, body := survivor.call(t, http.MethodGet, "/api/v2/jobs/"+job.ID, "")
		if status != http.StatusOK {
			t.Fatalf("get job: %d %s", status, body)
		}
		mustJSON(t, body, &job)
	}
	for deadline := time.Now().Add(time.Minute); job.State != "running"; readJob() {
		if time.Now().After(deadline) || job.State == "ended" {
			t.Fatalf("job %+v, want running within a minute", job)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // a few batches reach the node about to die

	mark := rte.Mark()
	fault(victim)
	killed := time.Now()
	rte.WaitLogMatch(mark, "welcomed", time.Minute, func(l map[string]any) bool { return l["node"] != victim })
	t.Logf("the surviving node dialled the RTE %s after %s was %s (lease TTL %s)",
		time.Since(killed).Round(time.Millisecond), victim, what, app.DefaultLeaseTTL)

	for deadline := time.Now().Add(3 * time.Minute); job.State != "ended"; readJob() {
		if time.Now().After(deadline) {
			t.Fatalf("job %+v did not end within 3 minutes", job)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if job.Status != protocol.StatusSuccess {
		t.Fatalf("job %+v, want success", job)
	}
	var out strings.Builder
	after := int64(0)
	for {
		status, body := survivor.call(t, http.MethodGet, fmt.Sprintf("/api/v2/jobs/%s/records?after=%d&limit=5000", job.ID, after), "")
		if status != http.StatusOK {
			t.Fatalf("records: %d %s", status, body)
		}
		var page struct {
			Records []protocol.Record `json:"records"`
		}
		mustJSON(t, body, &page)
		if len(page.Records) == 0 {
			break
		}
		for _, r := range page.Records {
			if r.Seq != after+1 {
				t.Fatalf("record seq %d follows %d: a gap or a repeat", r.Seq, after)
			}
			after = r.Seq
			if r.Kind == protocol.KindOutput {
				var d protocol.OutputData
				mustJSON(t, r.Data, &d)
				out.WriteString(d.Text)
			}
		}
	}
	checkLines(t, out.String(), lines)
	if countLog(rte, "resent spooled records") == 0 {
		t.Fatal("the RTE never resent spooled records to the surviving node")
	}
	noRace(t, rte)
}
