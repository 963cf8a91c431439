package jobs_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/jobs/afevents"
	"github.com/rte-project/rte/protocol"
)

const testToken = "test-rte-token-0123456789abcdef"

// safetyNet bounds every wait: a job on a loaded machine takes seconds, never this long.
const safetyNet = 2 * time.Minute

// memRecorder is the test's spool: records in memory, seq assigned per job, and the spool's
// own rules checked (valid JSON data, nothing after end).
type memRecorder struct {
	mu   sync.Mutex
	recs map[string][]protocol.Record
	wake chan struct{} // closed and replaced on every append
	bad  []string      // broken rules, reported by check
	// fail, when set, decides whether an append fails (the record is then not stored).
	fail func(job, kind string) error
}

func newMemRecorder() *memRecorder {
	return &memRecorder{recs: map[string][]protocol.Record{}, wake: make(chan struct{})}
}

func (r *memRecorder) Append(job, kind string, data json.RawMessage) (protocol.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		if err := r.fail(job, kind); err != nil {
			return protocol.Record{}, err
		}
	}
	recs := r.recs[job]
	if n := len(recs); n > 0 && recs[n-1].Kind == protocol.KindEnd {
		r.bad = append(r.bad, fmt.Sprintf("job %s: %s record appended after end", job, kind))
	}
	if !json.Valid(data) {
		r.bad = append(r.bad, fmt.Sprintf("job %s: %s record data is not JSON: %.200q", job, kind, data))
	}
	rec := protocol.Record{Job: job, Seq: int64(len(recs) + 1), Kind: kind, At: time.Now().UTC(), Data: data}
	if err := rec.Validate(); err != nil {
		r.bad = append(r.bad, fmt.Sprintf("job %s: invalid record: %v", job, err))
	}
	r.recs[job] = append(recs, rec)
	close(r.wake)
	r.wake = make(chan struct{})
	return rec, nil
}

func (r *memRecorder) Has(job string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs[job]) > 0
}

func (r *memRecorder) records(job string) []protocol.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]protocol.Record(nil), r.recs[job]...)
}

// waitFor waits until pred holds for the job's records and returns them.
func (r *memRecorder) waitFor(t *testing.T, job, what string, pred func([]protocol.Record) bool) []protocol.Record {
	t.Helper()
	deadline := time.After(safetyNet)
	for {
		r.mu.Lock()
		recs := append([]protocol.Record(nil), r.recs[job]...)
		wake := r.wake
		r.mu.Unlock()
		if pred(recs) {
			return recs
		}
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("job %s: waited %s for %s; records so far:\n%s", job, safetyNet, what, dump(recs))
		}
	}
}

// waitEnd waits for the job's end record and checks the records' order.
func (r *memRecorder) waitEnd(t *testing.T, job string) []protocol.Record {
	t.Helper()
	recs := r.waitFor(t, job, "the end record", func(recs []protocol.Record) bool {
		return len(recs) > 0 && recs[len(recs)-1].Kind == protocol.KindEnd
	})
	r.check(t, job, recs)
	return recs
}

// check asserts the rules of PROTOCOL.md section 7 for one job's records.
func (r *memRecorder) check(t *testing.T, job string, recs []protocol.Record) {
	t.Helper()
	r.mu.Lock()
	bad := append([]string(nil), r.bad...)
	r.mu.Unlock()
	for _, b := range bad {
		t.Errorf("recorder: %s", b)
	}
	for i, rec := range recs {
		if rec.Seq != int64(i+1) {
			t.Errorf("job %s: record %d has seq %d, want %d (gapless from 1)", job, i, rec.Seq, i+1)
		}
		if rec.Kind == protocol.KindStart && i != 0 {
			t.Errorf("job %s: start record at seq %d, want seq 1", job, rec.Seq)
		}
		if rec.Kind == protocol.KindEnd && i != len(recs)-1 {
			t.Errorf("job %s: end record at seq %d of %d, want it last", job, rec.Seq, len(recs))
		}
		if rec.Kind == protocol.KindOutput {
			var d protocol.OutputData
			if err := json.Unmarshal(rec.Data, &d); err != nil || !utf8.ValidString(d.Text) {
				t.Errorf("job %s: output record %d is not valid UTF-8 text: %v", job, rec.Seq, err)
			}
		}
	}
}

func dump(recs []protocol.Record) string {
	var b strings.Builder
	for _, r := range recs {
		d := string(r.Data)
		if len(d) > 300 {
			d = d[:300] + "..."
		}
		fmt.Fprintf(&b, "  %d %s %s\n", r.Seq, r.Kind, d)
	}
	return b.String()
}

func outputText(t *testing.T, recs []protocol.Record) string {
	t.Helper()
	var b strings.Builder
	for _, r := range recs {
		if r.Kind != protocol.KindOutput {
			continue
		}
		var d protocol.OutputData
		if err := json.Unmarshal(r.Data, &d); err != nil {
			t.Fatalf("output record %d: %v", r.Seq, err)
		}
		b.WriteString(d.Text)
	}
	return b.String()
}

// eventsOf returns every event of the events records, raw.
func eventsOf(t *testing.T, recs []protocol.Record) []json.RawMessage {
	t.Helper()
	var out []json.RawMessage
	for _, r := range recs {
		if r.Kind != protocol.KindEvents {
			continue
		}
		var d protocol.EventsData
		if err := json.Unmarshal(r.Data, &d); err != nil {
			t.Fatalf("events record %d: %v", r.Seq, err)
		}
		out = append(out, d.Events...)
	}
	return out
}

func eventNames(t *testing.T, recs []protocol.Record) []string {
	t.Helper()
	var names []string
	for _, raw := range eventsOf(t, recs) {
		var ev struct {
			Event string `json:"event"`
		}
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatalf("event %.200s: %v", raw, err)
		}
		names = append(names, ev.Event)
	}
	return names
}

func logMessages(t *testing.T, recs []protocol.Record) []string {
	t.Helper()
	var out []string
	for _, r := range recs {
		if r.Kind != protocol.KindLog {
			continue
		}
		var d protocol.LogData
		if err := json.Unmarshal(r.Data, &d); err != nil {
			t.Fatalf("log record %d: %v", r.Seq, err)
		}
		out = append(out, d.Level+": "+d.Message)
	}
	return out
}

func endOf(t *testing.T, recs []protocol.Record) protocol.EndData {
	t.Helper()
	last := recs[len(recs)-1]
	if last.Kind != protocol.KindEnd {
		t.Fatalf("last record is %s, want end", last.Kind)
	}
	var d protocol.EndData
	if err := json.Unmarshal(last.Data, &d); err != nil {
		t.Fatalf("end record: %v", err)
	}
	return d
}

func startOf(t *testing.T, recs []protocol.Record) protocol.StartData {
	t.Helper()
	if len(recs) == 0 || recs[0].Kind != protocol.KindStart {
		t.Fatalf("first record is not start:\n%s", dump(recs))
	}
	var d protocol.StartData
	if err := json.Unmarshal(recs[0].Data, &d); err != nil {
		t.Fatalf("start record: %v", err)
	}
	return d
}

func wantEnd(t *testing.T, recs []protocol.Record, status string, code int) protocol.EndData {
	t.Helper()
	end := endOf(t, recs)
	if end.Status != status || (code != anyCode && end.ExitCode != code) {
		t.Fatalf("end = %+v, want status %q exit code %d; records:\n%s", end, status, code, dump(recs))
	}
	return end
}

const anyCode = -1000

// testEnv is one Manager over the testdata playbooks, with its own directories.
type testEnv struct {
	m    *jobs.Manager
	rec  *memRecorder
	work string
}

func requireAnsible(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: this test runs the real ansible-playbook")
	}
	if _, err := exec.LookPath("ansible-playbook"); err != nil {
		t.Skip("ansible-playbook is not in PATH: apt-get install -y ansible-core")
	}
}

func newTestEnv(t *testing.T, mutate func(*jobs.Config)) *testEnv {
	t.Helper()
	requireAnsible(t)
	tmp := t.TempDir()
	pluginDir, err := afevents.Install(filepath.Join(tmp, "plugins"))
	if err != nil {
		t.Fatalf("afevents.Install: %v", err)
	}
	home := filepath.Join(tmp, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	rec := newMemRecorder()
	cfg := jobs.Config{
		Logger:    zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		Recorder:  rec,
		Files:     jobs.LocalFiles{AnsiblePath: abs("testdata/playbooks"), RepoPath: abs("testdata/repo")},
		Token:     testToken,
		WorkDir:   filepath.Join(tmp, "work"),
		PluginDir: pluginDir,
		Instance:  "test-host",
		BaseEnv: []string{
			"PATH=" + os.Getenv("PATH"),
			"HOME=" + home,
			"LANG=C.UTF-8",
			"ANSIBLE_LOCAL_TEMP=" + filepath.Join(tmp, "ansible-tmp"),
		},
		KillGrace:     5 * time.Second,
		BatchInterval: 50 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := jobs.New(cfg)
	if err != nil {
		t.Fatalf("jobs.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), safetyNet)
		defer cancel()
		if err := m.Drain(ctx, 0); err != nil {
			t.Errorf("Drain at cleanup: %v", err)
		}
		m.Wait()
		_ = m.Close()
	})
	return &testEnv{m: m, rec: rec, work: cfg.WorkDir}
}

// fakeConfig makes the Manager run the test binary as its ansible-playbook.
func fakeConfig(cfg *jobs.Config) { cfg.AnsiblePlaybook = os.Args[0] }

func jobStart(id, playbook string) *protocol.JobStart {
	return &protocol.JobStart{Job: id, Playbook: playbook, Inventories: []string{"hosts"}}
}

func fakeJob(id, mode string) *protocol.JobStart {
	js := jobStart(id, "success.yml")
	js.Env = map[string]string{fakeChildEnv: mode}
	return js
}

func (e *testEnv) start(t *testing.T, js *protocol.JobStart) {
	t.Helper()
	if err := e.m.Start(js); err != nil {
		t.Fatalf("Start(%s): %v", js.Job, err)
	}
}

func (e *testEnv) wantDirGone(t *testing.T, job string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(e.work, job)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("job directory %s after the end: stat says %v, want it removed", filepath.Join(e.work, job), err)
	}
}

// groupMembers lists the live (not zombie) processes of process group pgid, from /proc.
func groupMembers(pgid int) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			comm := string(b[bytes.IndexByte(b, '(')+1 : i])
			out = append(out, fmt.Sprintf("%d(%s)", pid, comm))
		}
	}
	return out
}

// wantGroupGone waits for every process of the group to be gone: SIGKILL is delivered
// asynchronously, so one may still be exiting when the end is recorded.
func wantGroupGone(t *testing.T, pgid int) {
	t.Helper()
	var members []string
	if !testenv.Poll(10*time.Second, func() bool { members = groupMembers(pgid); return len(members) == 0 }) {
		t.Fatalf("process group %d still has live processes 10s after the end: %v", pgid, members)
	}
	if err := syscall.Kill(-pgid, 0); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill(-%d, 0) = %v, want ESRCH or success on zombies only", pgid, err)
	}
}

func seal(t *testing.T, job, secret string) string {
	t.Helper()
	s, err := protocol.SealSecret(testToken, job, secret)
	if err != nil {
		t.Fatalf("SealSecret: %v", err)
	}
	return s
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// wantSuccessYML checks the records of testdata's success.yml run with the extravar greeting
// "from-extravars-42": the start (a pid, instance test-host, the image, "" for a process), a
// successful end, the playbook's output and the events named, whatever the engine.
func wantSuccessYML(t *testing.T, recs []protocol.Record, image string, events ...string) {
	t.Helper()
	start := startOf(t, recs)
	if start.PID <= 0 || start.Instance != "test-host" || start.Playbook != "success.yml" || start.Image != image {
		t.Errorf("start = %+v, want a pid, instance test-host, playbook success.yml, image %q", start, image)
	}
	wantEnd(t, recs, protocol.StatusSuccess, 0)
	out := outputText(t, recs)
	for _, want := range []string{"TASK [say hello]", "hello from-extravars-42", "TASK [run a command]", "ok=2"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q; output:\n%s", want, out)
		}
	}
	names := eventNames(t, recs)
	for _, want := range events {
		if !slices.Contains(names, want) {
			t.Errorf("events lack %q; got %v", want, names)
		}
	}
}
