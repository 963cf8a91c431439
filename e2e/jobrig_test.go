package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

const joinToken = "e2e-join-token-0123456789"

// jobRig is the real app half (SQLite store, Run loop) with one real inbound RTE over TLS,
// approved by join token, running playbooks from e2e/testdata with RTE_FILES=local (options
// change that: withRTEEnv, withApp). The app reaches the RTE through a TCP proxy that a test
// can cut.
type jobRig struct {
	t     testing.TB
	App   *app.App
	Store app.Store
	RTE   *rteProc
	Proxy *testenv.Forwarder
	Name  string
	dir   string
	env   []string
	bin   string              // the rte binary
	cred  *syscall.Credential // the RTE's user; nil: the test's own

	// side is this node's app half: for more app nodes on the same store (nodes_test.go), its
	// file, the config it was made with, and its listener, where the RTE registers. Nil on a
	// rig over another helper's App (outboundApp.rig).
	side *appSide
}

type rigOption func(*rigConfig)

type rigConfig struct {
	rteEnv  []string
	appEdit func(*app.Config)
	cred    *syscall.Credential
}

func withRTEEnv(kv ...string) rigOption {
	return func(c *rigConfig) { c.rteEnv = append(c.rteEnv, kv...) }
}

// asUser runs the RTE as another user (the test must be root): its directory is made outside
// the test's temporary directory, which only root may enter, and given to that user, and the
// binary is copied where that user can run it.
func asUser(cred *syscall.Credential) rigOption {
	return func(c *rigConfig) { c.cred = cred }
}

// withApp changes the app's config before the app is made (a bundle source, say).
func withApp(edit func(*app.Config)) rigOption {
	return func(c *rigConfig) { c.appEdit = edit }
}

func newJobRig(t testing.TB, opts ...rigOption) *jobRig {
	t.Helper()
	var cfg rigConfig
	for _, o := range opts {
		o(&cfg)
	}
	appOpts := []appOption{onSQLite(""), served(), withAppConfig(func(c *app.Config) {
		c.JoinToken = joinToken
		c.RedialMin, c.RedialMax = 50*time.Millisecond, 300*time.Millisecond
		c.PollInterval = 100 * time.Millisecond
	})}
	if cfg.appEdit != nil {
		appOpts = append(appOpts, withAppConfig(cfg.appEdit))
	}
	side := startAppSide(t, appOpts...)

	testdata, _ := filepath.Abs("testdata")
	port := freePort(t)
	px := testenv.StartForwarder(t, fmt.Sprintf("127.0.0.1:%d", port))
	r := &jobRig{t: t, App: side.App, Store: side.Store, Proxy: px, Name: "rte-jobs", dir: t.TempDir(), side: side,
		bin: filepath.Join(binDir, "rte"), cred: cfg.cred}
	if cfg.cred != nil {
		r.dir, r.bin = userDirs(t, cfg.cred)
	}
	r.env = append([]string{
		"HTTPS=1", "RTE_TOKEN=" + testToken, "RTE_NAME=" + r.Name, "RTE_JOIN_TOKEN=" + joinToken,
		"APP_URL=" + side.URL, "RTE_URL=https://" + px.Addr(),
		"RTE_FILES=local", "ANSIBLE_PATH=" + filepath.Join(testdata, "playbooks"),
		"REPO_PATH=" + filepath.Join(testdata, "inventory"),
		"RTE_DRAIN_SECONDS=2",
	}, cfg.rteEnv...)
	r.RTE = testenv.StartRTEAs(t, r.cred, r.bin, r.dir, port, r.env...)

	side.Start(t)
	r.waitConnected()
	return r
}

// Stop ends the app's Run loop and waits for it.
func (r *jobRig) Stop() {
	if r.side != nil {
		r.side.Stop()
	}
}

// Restart starts the RTE again in the same directory (same certificate, same spool).
func (r *jobRig) Restart() {
	r.t.Helper()
	r.RTE.Kill()
	r.RTE = testenv.StartRTEAs(r.t, r.cred, r.bin, r.dir, r.RTE.Port, r.env...)
}

func (r *jobRig) waitConnected() {
	r.t.Helper()
	if !testenv.Poll(60*time.Second, func() bool { st, ok := r.App.Status(r.Name); return ok && st.Connected }) {
		r.t.Fatalf("the app did not connect to runner %s within 60s", r.Name)
	}
}

// submit queues a job on the rig's runner.
func (r *jobRig) submit(js protocol.JobStart) *app.Job {
	r.t.Helper()
	j, err := r.App.Submit(context.Background(), app.JobRequest{Runner: r.Name, JobStart: js})
	if err != nil {
		r.t.Fatalf("submit %s: %v", js.Playbook, err)
	}
	return j
}

// waitState waits until the job is in state (or ended, which ends every wait).
func (r *jobRig) waitState(id string, state app.JobState, timeout time.Duration) *app.Job {
	r.t.Helper()
	j := r.pollJob(id, timeout, func(j *app.Job) bool { return j.State == state || j.State == app.JobEnded })
	if j == nil || (j.State != state && j.State != app.JobEnded) {
		r.t.Fatalf("job %s not %s within %s: %+v", id, state, timeout, j)
	}
	return j
}

// waitEnd waits for the job's end, and for every record up to it to be stored.
func (r *jobRig) waitEnd(id string, timeout time.Duration) *app.Job {
	r.t.Helper()
	j := r.pollJob(id, timeout, func(j *app.Job) bool { return j.State == app.JobEnded })
	if j == nil || j.State != app.JobEnded {
		r.t.Fatalf("job %s did not end within %s: %+v\nRTE log:\n%s", id, timeout, j, testenv.Tail(r.RTE.Log(), 40))
	}
	return j
}

// pollJob reads the job until done accepts it or timeout passes, and returns the last read.
func (r *jobRig) pollJob(id string, timeout time.Duration, done func(*app.Job) bool) *app.Job {
	r.t.Helper()
	var j *app.Job
	testenv.Poll(timeout, func() bool {
		var err error
		j, err = r.App.GetJob(context.Background(), id)
		if err != nil {
			r.t.Fatal(err)
		}
		return done(j)
	})
	return j
}

// records reads every stored record of a job.
func (r *jobRig) records(id string) []protocol.Record {
	r.t.Helper()
	var out []protocol.Record
	after := int64(0)
	for {
		recs, err := r.App.Records(context.Background(), id, after, 1000)
		if err != nil {
			r.t.Fatal(err)
		}
		if len(recs) == 0 {
			return out
		}
		out = append(out, recs...)
		after = recs[len(recs)-1].Seq
	}
}

// jobStory is a job's records read back: checked for order, gaps and shape.
type jobStory struct {
	Records []protocol.Record
	Output  string
	Events  []map[string]any
	Logs    []protocol.LogData
	End     protocol.EndData
}

// story reads the job's records and checks the contract every job keeps: seq 1..n without a
// gap or a repeat, start first when present, end last and only last.
func (r *jobRig) story(id string) jobStory {
	r.t.Helper()
	recs := r.records(id)
	var s jobStory
	s.Records = recs
	var out strings.Builder
	for i, rec := range recs {
		if rec.Seq != int64(i+1) {
			r.t.Fatalf("job %s: record %d has seq %d: stored out of order, twice, or with a gap", id, i+1, rec.Seq)
		}
		switch rec.Kind {
		case protocol.KindStart:
			if i != 0 {
				r.t.Fatalf("job %s: start record at seq %d, want 1", id, rec.Seq)
			}
		case protocol.KindOutput:
			var d protocol.OutputData
			mustJSON(r.t, rec.Data, &d)
			out.WriteString(d.Text)
		case protocol.KindEvents:
			var d struct {
				Events []map[string]any `json:"events"`
			}
			mustJSON(r.t, rec.Data, &d)
			s.Events = append(s.Events, d.Events...)
		case protocol.KindLog:
			var d protocol.LogData
			mustJSON(r.t, rec.Data, &d)
			s.Logs = append(s.Logs, d)
		case protocol.KindEnd:
			if i != len(recs)-1 {
				r.t.Fatalf("job %s: end record at seq %d of %d", id, rec.Seq, len(recs))
			}
			mustJSON(r.t, rec.Data, &s.End)
		}
	}
	if len(recs) == 0 || recs[len(recs)-1].Kind != protocol.KindEnd {
		r.t.Fatalf("job %s: the last stored record is not its end (%d records)", id, len(recs))
	}
	s.Output = out.String()
	return s
}

func (s jobStory) eventNames() []string {
	var out []string
	for _, e := range s.Events {
		n, _ := e["event"].(string)
		out = append(out, n)
	}
	return out
}

func (s jobStory) hasEvent(name string) bool {
	for _, n := range s.eventNames() {
		if n == name {
			return true
		}
	}
	return false
}

func mustJSON(t testing.TB, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

// processesWith lists the pids whose command line contains marker.
func processesWith(marker string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), marker) {
			out = append(out, e.Name())
		}
	}
	return out
}

// userDirs makes the RTE's directory, owned by cred's user, and a copy of the rte binary that
// user can run, both under the system's temporary directory (the test's own is root's only);
// the test's end removes them.
func userDirs(t testing.TB, cred *syscall.Credential) (dir, bin string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to start the RTE as another user")
	}
	top, err := os.MkdirTemp("", "rte-e2e-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	dir = filepath.Join(top, "rte")
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(binDir, "rte"))
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(top, "rte-bin")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}
