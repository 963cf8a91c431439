package rte_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/rte"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testToken = "rte-run-token-0123456789abcdef"
	joinToken = "rte-run-join-token-0123456789"
	runner    = "rte-run"
)

// theApp is the real app half (SQLite store, its Run loop) behind a real listener, for an
// in-process RTE to register with and be dialled by.
type theApp struct {
	*app.App
	url string
}

func startApp(t *testing.T) *theApp {
	t.Helper()
	store, err := sqlitestore.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(app.Config{
		Store: store, Logger: zaptest.NewLogger(t).Named("app"), Node: "app-1", JoinToken: joinToken,
		RedialMin: 50 * time.Millisecond, RedialMax: 300 * time.Millisecond, PollInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close(); store.Close() })
	return &theApp{App: a, url: srv.URL}
}

// running is one in-process Run: its signal channel, its logs, and its answer once it returns.
type running struct {
	t       *testing.T
	url     string
	sigs    chan os.Signal
	cancel  context.CancelFunc
	done    chan error
	logs    *observer.ObservedLogs
	probe   *http.Client
	stopped sync.Once
}

// env is an inbound RTE over TLS with its files in dir, running playbooks from e2e/testdata;
// with a, it registers there and is approved by the join token.
func env(t *testing.T, dir string, a *theApp, port int, extra ...string) []string {
	testdata, err := filepath.Abs("../../e2e/testdata")
	if err != nil {
		t.Fatal(err)
	}
	e := []string{
		"HTTPS=1", "RTE_TOKEN=" + testToken, "RTE_NAME=" + runner, "LISTEN_HOST=127.0.0.1", fmt.Sprintf("PORT=%d", port),
		"RTE_FILES=local", "ANSIBLE_PATH=" + filepath.Join(testdata, "playbooks"), "REPO_PATH=" + filepath.Join(testdata, "inventory"),
		"RTE_SPOOL_PATH=" + filepath.Join(dir, "spool"), "RTE_WORK_PATH=" + filepath.Join(dir, "work"),
		"HTTPS_CERT=" + filepath.Join(dir, "cert.pem"), "HTTPS_KEY=" + filepath.Join(dir, "key.pem"),
		"RTE_DRAIN_SECONDS=2", "PATH=" + os.Getenv("PATH"), "HOME=" + dir,
	}
	if a != nil {
		e = append(e, "APP_URL="+a.url, fmt.Sprintf("RTE_URL=https://127.0.0.1:%d", port), "RTE_JOIN_TOKEN="+joinToken)
	}
	return append(e, extra...)
}

// start runs the RTE in this process on a listener it makes on a free port (port 0) or the
// port given (a restart), and waits until /ready answers.
func start(t *testing.T, dir string, a *theApp, port int) *running {
	t.Helper()
	return startWith(t, dir, a, port)
}

// startWith is start with more settings (later ones win).
func startWith(t *testing.T, dir string, a *theApp, port int, extra ...string) *running {
	t.Helper()
	r := launch(t, dir, a, port, extra...)
	testenv.Eventually(t, time.Minute, "/ready 200", func() bool { code, _ := r.get("/ready"); return code == http.StatusOK })
	return r
}

// launch runs the RTE like start, without waiting for /ready.
func launch(t *testing.T, dir string, a *theApp, port int, extra ...string) *running {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	port = ln.Addr().(*net.TCPAddr).Port
	s, err := config.Load(env(t, dir, a, port, extra...), "testhost")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, url: fmt.Sprintf("https://127.0.0.1:%d", port), sigs: make(chan os.Signal, 2),
		cancel: cancel, done: make(chan error, 1), logs: logs}
	go func() {
		r.done <- rte.Run(ctx, s, logger, rte.Options{Environ: env(t, dir, a, port, extra...), Signals: r.sigs, Listener: ln, Version: "1.2.3-test"})
	}()
	t.Cleanup(func() { r.stop() })
	// Run owns s from here on (it resolves the paths in it): the test reads its own copy.
	cert := filepath.Join(dir, "cert.pem")
	testenv.Eventually(t, time.Minute, "the certificate written", func() bool { _, err := os.Stat(cert); return err == nil })
	pem, err := os.ReadFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	// No keep-alive: an idle pooled connection would outlive the test and trip goleak.
	r.probe = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}}
	return r
}

func (r *running) get(path string) (int, string) {
	resp, err := r.probe.Get(r.url + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// wait returns Run's answer, failing the test when it does not come within limit.
func (r *running) wait(limit time.Duration) error {
	r.t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for stop
		return err
	case <-time.After(limit):
		r.t.Fatalf("Run did not return within %s", limit)
		return nil
	}
}

// stop ends Run through its context, as a test's end does, and waits for it.
func (r *running) stop() {
	r.stopped.Do(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(time.Minute):
			r.t.Error("Run did not return within a minute of its context's end")
		}
	})
}

func (r *running) logged(msg string) bool { return r.logs.FilterMessage(msg).Len() > 0 }

func waitConnected(t *testing.T, a *theApp) {
	t.Helper()
	testenv.Eventually(t, time.Minute, "the app connected to the runner", func() bool { st, ok := a.Status(runner); return ok && st.Connected })
}

func waitJob(t *testing.T, a *theApp, id string, done func(*app.Job) bool) *app.Job {
	t.Helper()
	var j *app.Job
	testenv.Eventually(t, time.Minute, "job "+id, func() bool {
		var err error
		if j, err = a.GetJob(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		return done(j)
	})
	return j
}

// TestReadinessAndSignals: /ready answers 200 once serving; SIGHUP is logged and changes
// nothing; SIGTERM turns /ready to 503 "draining" and Run returns nil.
func TestReadinessAndSignals(t *testing.T) {
	r := start(t, t.TempDir(), nil, 0)
	if code, body := r.get("/live"); code != http.StatusOK {
		t.Fatalf("/live = %d %q, want 200", code, body)
	}
	r.sigs <- syscall.SIGHUP
	testenv.Eventually(t, time.Minute, "SIGHUP logged", func() bool {
		return r.logged("SIGHUP ignored: settings are read once, at start; restart the RTE to change them (SIGTERM drains)")
	})
	if code, body := r.get("/ready"); code != http.StatusOK {
		t.Fatalf("/ready after SIGHUP = %d %q, want 200: a hang-up must change nothing", code, body)
	}
	r.sigs <- syscall.SIGTERM
	testenv.Eventually(t, time.Minute, "/ready 503 draining, or the listener closed", func() bool {
		code, body := r.get("/ready")
		return (code == http.StatusServiceUnavailable && strings.Contains(body, "draining")) || code == 0
	})
	if err := r.wait(time.Minute); err != nil {
		t.Fatalf("Run after SIGTERM: %v, want nil", err)
	}
	if !r.logged("stopping") {
		t.Fatal("no \"stopping\" line after SIGTERM")
	}
}

// TestShutdownByContext: the end of ctx stops Run without a signal, and Run returns nil.
func TestShutdownByContext(t *testing.T) {
	r := start(t, t.TempDir(), nil, 0)
	r.cancel()
	if err := r.wait(time.Minute); err != nil {
		t.Fatalf("Run after its context ended: %v, want nil", err)
	}
	if code, _ := r.get("/live"); code != 0 {
		t.Fatalf("/live answers %d after Run returned, want the listener closed", code)
	}
}

// TestDrainEndsJobsAbandoned: SIGTERM while a playbook runs turns /ready to 503, gives the
// job RTE_DRAIN_SECONDS and then stops it; Run returns nil with the end spooled, and the app
// has the end (abandoned) once the RTE is back.
func TestDrainEndsJobsAbandoned(t *testing.T) {
	a := startApp(t)
	dir := t.TempDir()
	r := start(t, dir, a, 0)
	waitConnected(t, a)
	j, err := a.Submit(context.Background(), app.JobRequest{Runner: runner, JobStart: protocol.JobStart{
		Playbook: "sleep.yml", Inventories: []string{"local.ini"}, Extravars: json.RawMessage(`{"seconds":"315"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	waitJob(t, a, j.ID, func(j *app.Job) bool { return j.State == app.JobRunning || j.State == app.JobEnded })
	r.sigs <- syscall.SIGTERM
	testenv.Eventually(t, time.Minute, "/ready 503 on SIGTERM", func() bool {
		code, _ := r.get("/ready")
		return code == http.StatusServiceUnavailable
	})
	if err := r.wait(time.Minute); err != nil {
		t.Fatalf("Run after a drain: %v, want nil", err)
	}
	if jobs := processesWith("sleep 315"); len(jobs) > 0 {
		t.Fatalf("the playbook outlived the drain: %v", jobs)
	}

	port := mustPort(t, r.url)
	start(t, dir, a, port)
	end := waitJob(t, a, j.ID, func(j *app.Job) bool { return j.State == app.JobEnded })
	if end.Status != protocol.StatusAbandoned {
		t.Fatalf("job %+v, want abandoned after the drain ran out", end)
	}
	assertRecords(t, a, j.ID)
}

// assertRecords checks the job's stored records: seq 1..n without a gap or a repeat, the end
// last and only last.
func assertRecords(t *testing.T, a *theApp, id string) {
	t.Helper()
	recs, err := a.Records(context.Background(), id, 0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	for i, rec := range recs {
		if rec.Seq != int64(i+1) {
			t.Fatalf("record %d has seq %d: stored out of order, twice, or with a gap", i+1, rec.Seq)
		}
		if (rec.Kind == protocol.KindEnd) != (i == len(recs)-1) {
			t.Fatalf("record %d of %d is %s: the end must be last and only last", i+1, len(recs), rec.Kind)
		}
	}
}

func mustPort(t *testing.T, url string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(url, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	var port int
	_, _ = fmt.Sscan(p, &port)
	return port
}

// processesWith lists the command lines of running processes that contain marker.
func processesWith(marker string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, marker) && !strings.Contains(cmd, "/proc") {
			out = append(out, cmd)
		}
	}
	return out
}

// TestRestoreEndsAbandonedJobs: a job the spool holds without an end, as a killed RTE leaves
// it, is ended at the next start with a log record and an end "abandoned", and the processes it
// left in its group are stopped.
func TestRestoreEndsAbandonedJobs(t *testing.T) {
	dir := t.TempDir()
	const job = "left-behind"
	leftover := exec.Command("sleep", "317")
	leftover.Env = append(os.Environ(), jobs.JobIDEnv+"="+job)
	leftover.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := leftover.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = leftover.Wait(); close(exited) }()
	t.Cleanup(func() { _ = leftover.Process.Kill(); <-exited })

	sp, err := spool.Open(filepath.Join(dir, "spool"), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	startData, _ := json.Marshal(protocol.StartData{PID: leftover.Process.Pid, Instance: "testhost", Playbook: "sleep.yml"})
	if _, err := sp.Append(job, protocol.KindStart, startData); err != nil {
		t.Fatal(err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}

	r := start(t, dir, nil, 0)
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("the process the job left behind still runs a minute after the start")
	}
	for _, msg := range []string{"stopped processes left running by the previous start", "ended a job left running by the previous start"} {
		if !r.logged(msg) {
			t.Errorf("no log line %q", msg)
		}
	}
	r.stop()

	sp, err = spool.Open(filepath.Join(dir, "spool"), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	var recs []protocol.Record
	if err := sp.Pending(job, 0, func(rec protocol.Record, _ []byte) error { recs = append(recs, rec); return nil }); err != nil {
		t.Fatal(err)
	}
	kinds := make([]string, len(recs))
	for i, rec := range recs {
		kinds[i] = rec.Kind
	}
	if strings.Join(kinds, ",") != "start,log,end" {
		t.Fatalf("records of the job left running: %v, want start, log, end", kinds)
	}
	var end protocol.EndData
	if err := json.Unmarshal(recs[2].Data, &end); err != nil {
		t.Fatal(err)
	}
	if end.Status != protocol.StatusAbandoned || end.ExitCode != -1 || end.Message != "the RTE restarted while the job ran" {
		t.Fatalf("end %+v, want abandoned, exit code -1, saying the RTE restarted", end)
	}
}
