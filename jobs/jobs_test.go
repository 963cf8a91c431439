package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/protocol"
)

// The tests below run the real ansible-playbook against localhost, in parallel: each run takes
// seconds of CPU, and they are independent.

func TestSuccess(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	js := jobStart("ok-1", "success.yml")
	js.Extravars = json.RawMessage(`{"greeting": "from-extravars-42"}`)
	e.start(t, js)
	recs := e.rec.waitEnd(t, "ok-1")

	wantSuccessYML(t, recs, "", "playbook_on_start", "playbook_on_task_start", "runner_on_ok", "playbook_on_stats")
	e.wantDirGone(t, "ok-1")
	e.m.Wait() // the job leaves Running just after its end is recorded
	if got := e.m.Running(); len(got) != 0 {
		t.Errorf("Running() after the end = %v, want none", got)
	}
}

func TestFailedTask(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	e.start(t, jobStart("fail-1", "failed.yml"))
	recs := e.rec.waitEnd(t, "fail-1")
	end := wantEnd(t, recs, protocol.StatusFailed, 2)
	if !strings.Contains(end.Message, "exited 2") || !strings.Contains(end.Message, "hosts failed") {
		t.Errorf("end message %q, want it to say exit 2 means a host failed", end.Message)
	}
	if out := outputText(t, recs); !strings.Contains(out, "boom on purpose") {
		t.Errorf("output lacks the failure message; output:\n%s", out)
	}
	if !slices.Contains(eventNames(t, recs), "runner_on_failed") {
		t.Errorf("events lack runner_on_failed")
	}
}

// The vault password opens the playbook's vaulted variable (so ansible read the file), and
// the playbook prints both secrets: neither may reach a record, in any form.
func TestSecretsAreMaskedInOutputAndEvents(t *testing.T) {
	t.Parallel()
	const (
		vaultPW  = `vault-pw-Ünïcode"42` // a quote and non-ASCII: JSON escapes it in two ways
		becomePW = "become-pw-5c0ffee"
	)
	e := newTestEnv(t, nil)
	js := jobStart("secret-1", "secret.yml")
	js.Secrets = map[string]string{
		"vault_password":  seal(t, "secret-1", vaultPW),
		"become_password": seal(t, "secret-1", becomePW),
	}
	ev, _ := json.Marshal(map[string]string{"leak": vaultPW, "leak_become": becomePW})
	js.Extravars = ev
	e.start(t, js)
	recs := e.rec.waitEnd(t, "secret-1")
	wantEnd(t, recs, protocol.StatusSuccess, 0)

	out := outputText(t, recs)
	if !strings.Contains(out, "vaulted=the-vaulted-value-7731") {
		t.Errorf("output lacks the vaulted value: ansible did not read the vault password file; output:\n%s", out)
	}
	if !strings.Contains(out, "leak=********") || !strings.Contains(out, "become=********") {
		t.Errorf("output lacks the masked secrets; output:\n%s", out)
	}
	forms := []string{vaultPW, `vault-pw-Ünïcode\"42`, `vault-pw-\u00dcn\u00efcode\"42`, becomePW}
	for _, r := range recs {
		for _, f := range forms {
			if strings.Contains(string(r.Data), f) {
				t.Errorf("record %d (%s) holds the secret %q: %.300s", r.Seq, r.Kind, f, r.Data)
			}
		}
	}
	events := eventsOf(t, recs)
	masked := 0
	for _, raw := range events {
		if strings.Contains(string(raw), "leak=********") || strings.Contains(string(raw), "become=********") {
			masked++
		}
	}
	if masked == 0 {
		t.Errorf("no event shows a masked secret; %d events", len(events))
	}
	logs := strings.Join(logMessages(t, recs), "\n")
	for _, want := range []string{"vault_password given", "become_password given"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log records lack %q; logs:\n%s", want, logs)
		}
	}
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	js := jobStart("timeout-1", "sleep.yml")
	js.TimeoutS = 2
	e.start(t, js)
	recs := e.rec.waitEnd(t, "timeout-1")
	end := wantEnd(t, recs, protocol.StatusTimeout, anyCode)
	if !strings.Contains(end.Message, "timeout_s (2 s)") {
		t.Errorf("end message %q, want it to name timeout_s", end.Message)
	}
	wantGroupGone(t, startOf(t, recs).PID)
	e.wantDirGone(t, "timeout-1")
}

// Cancel stops the whole process group: the shell and both sleeps it started, one of them in
// the background, which ansible itself would wait for.
func TestCancelStopsTheWholeGroup(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	e.start(t, jobStart("cancel-1", "background.yml"))
	recs := e.rec.waitFor(t, "cancel-1", "the start record", func(r []protocol.Record) bool { return len(r) > 0 })
	pgid := startOf(t, recs).PID
	if !testenv.Poll(safetyNet, func() bool {
		sleeps := 0
		for _, p := range groupMembers(pgid) {
			if strings.HasSuffix(p, "(sleep)") {
				sleeps++
			}
		}
		return sleeps >= 2
	}) {
		t.Fatalf("the playbook's two sleeps never appeared in process group %d: %v", pgid, groupMembers(pgid))
	}
	if !e.m.Cancel("cancel-1") {
		t.Fatalf("Cancel(cancel-1) = false, want true for a running job")
	}
	recs = e.rec.waitEnd(t, "cancel-1")
	wantEnd(t, recs, protocol.StatusCanceled, anyCode)
	wantGroupGone(t, pgid)
	e.wantDirGone(t, "cancel-1")
	if e.m.Cancel("cancel-1") {
		t.Errorf("Cancel after the end = true, want false")
	}
}

func TestCapacityAndDuplicates(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, func(c *jobs.Config) { c.MaxJobs = 1 })
	select { // drop a signal left from before, so the next one is this Start's
	case <-e.m.Changed():
	default:
	}
	e.start(t, jobStart("cap-long", "sleep.yml"))
	select {
	case <-e.m.Changed():
	case <-time.After(safetyNet):
		t.Fatal("no Changed signal after a job was accepted")
	}
	if c := e.m.Capacity(); c != (protocol.Capacity{Running: 1, MaxJobs: 1}) {
		t.Errorf("Capacity = %+v, want 1 running of 1", c)
	}
	err := e.m.Start(jobStart("cap-short", "success.yml"))
	var r *jobs.Refusal
	if !errors.As(err, &r) || r.Code != protocol.RefusedFull {
		t.Fatalf("second Start with MaxJobs=1 = %v, want a %q refusal", err, protocol.RefusedFull)
	}
	// A repeated job.start of the running job is accepted and not started again.
	if err := e.m.Start(jobStart("cap-long", "sleep.yml")); err != nil {
		t.Errorf("duplicate Start of a running job = %v, want nil (accepted)", err)
	}
	e.m.SetMaxJobs(2)
	if c := e.m.Capacity(); c.MaxJobs != 2 {
		t.Errorf("Capacity after SetMaxJobs(2) = %+v, want max_jobs 2", c)
	}
	js := jobStart("cap-short", "success.yml")
	js.Extravars = json.RawMessage(`{"greeting": "second"}`)
	e.start(t, js)
	short := e.rec.waitEnd(t, "cap-short")
	wantEnd(t, short, protocol.StatusSuccess, 0)
	// The job has ended and its records are still in the Recorder: accepted, not run again.
	if err := e.m.Start(js); err != nil {
		t.Errorf("Start of a job with records in the Recorder = %v, want nil (accepted)", err)
	}
	e.m.Cancel("cap-long")
	long := e.rec.waitEnd(t, "cap-long")
	wantEnd(t, long, protocol.StatusCanceled, anyCode)
	e.m.Wait()
	for job, recs := range map[string][]protocol.Record{"cap-long": long, "cap-short": short} {
		starts := 0
		for _, r := range e.rec.records(job) {
			if r.Kind == protocol.KindStart {
				starts++
			}
		}
		if starts != 1 || len(e.rec.records(job)) != len(recs) {
			t.Errorf("job %s: %d start records and %d records after the repeats, want 1 and %d", job, starts, len(e.rec.records(job)), len(recs))
		}
	}
	e.m.SetMaxJobs(0)
	if c := e.m.Capacity(); c != (protocol.Capacity{Running: 0, MaxJobs: 1}) {
		t.Errorf("Capacity after SetMaxJobs(0) = %+v, want the configured 1 and none running", c)
	}
}

func TestDrainAbandonsWhatOutlivesGrace(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	e.start(t, jobStart("drain-1", "sleep.yml"))
	recs := e.rec.waitFor(t, "drain-1", "the sleep task", func(r []protocol.Record) bool {
		return strings.Contains(outputText(t, r), "TASK [sleep a while]")
	})
	ctx, cancel := context.WithTimeout(context.Background(), safetyNet)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- e.m.Drain(ctx, 300*time.Millisecond) }()
	for !e.m.Capacity().Draining {
		time.Sleep(5 * time.Millisecond)
	}
	err := e.m.Start(jobStart("drain-2", "success.yml"))
	var r *jobs.Refusal
	if !errors.As(err, &r) || r.Code != protocol.RefusedDraining {
		t.Errorf("Start while draining = %v, want a %q refusal", err, protocol.RefusedDraining)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Drain = %v, want nil", err)
	}
	// Drain returned, so the end is recorded already.
	recs = e.rec.records("drain-1")
	e.rec.check(t, "drain-1", recs)
	wantEnd(t, recs, protocol.StatusAbandoned, anyCode)
	wantGroupGone(t, startOf(t, recs).PID)
	if c := e.m.Capacity(); c.Running != 0 || !c.Draining {
		t.Errorf("Capacity after Drain = %+v, want none running and draining", c)
	}
}

// Ansible sees BaseEnv, the job's env and the RTE's own settings, and nothing else of the
// process that runs it: TestMain put RTE_TOKEN and METRICS_TOKEN in this process's environment.
func TestEnvironmentIsOnlyWhatIsGiven(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	js := jobStart("env-1", "env.yml")
	js.Env = map[string]string{"JOB_MARKER": "marker-from-job-env"}
	e.start(t, js)
	recs := e.rec.waitEnd(t, "env-1")
	wantEnd(t, recs, protocol.StatusSuccess, 0)
	out := outputText(t, recs)
	for _, want := range []string{"rte_token=[] metrics_token=[] marker=[marker-from-job-env]", "JOB_MARKER=marker-from-job-env", "ANSIBLE_CALLBACKS_ENABLED=af_events", "ANSIBLE_LOCAL_TEMP=" + filepath.Join(e.work, "env-1")} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q; output:\n%s", want, out)
		}
	}
	for _, r := range recs {
		for _, leak := range []string{leakToken, leakMetrics, "RTE_TOKEN=", "METRICS_TOKEN="} {
			if strings.Contains(string(r.Data), leak) {
				t.Errorf("record %d (%s) shows %q from the RTE's own environment", r.Seq, r.Kind, leak)
			}
		}
	}
}

func TestOutputCutAtMaxOutputBytes(t *testing.T) {
	t.Parallel()
	const limit = 4096
	e := newTestEnv(t, func(c *jobs.Config) { c.MaxOutputBytes = limit })
	e.start(t, jobStart("big-1", "big.yml"))
	recs := e.rec.waitEnd(t, "big-1")
	wantEnd(t, recs, protocol.StatusSuccess, 0)
	if out := outputText(t, recs); len(out) > limit || len(out) < limit/2 {
		t.Errorf("output is %d bytes, want at most %d (and most of it)", len(out), limit)
	}
	cuts := 0
	for _, l := range logMessages(t, recs) {
		if strings.Contains(l, "output cut at 4096 bytes") {
			cuts++
		}
	}
	if cuts != 1 {
		t.Errorf("%d log records say the output was cut, want 1; logs: %v", cuts, logMessages(t, recs))
	}
	if !slices.Contains(eventNames(t, recs), "playbook_on_stats") {
		t.Errorf("events after the cut lack playbook_on_stats")
	}
}

// A Recorder that fails (a full disk) stops the job; the end still says why if it can be
// appended, and nothing is appended between the failure and the end.
func TestSpoolFailureStopsTheJob(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, func(c *jobs.Config) { c.KillGrace = time.Second })
	e.rec.fail = func(job, kind string) error {
		if kind != protocol.KindStart && kind != protocol.KindEnd {
			return errors.New("write spool: no space left on device")
		}
		return nil
	}
	e.start(t, jobStart("spool-1", "sleep.yml"))
	recs := e.rec.waitEnd(t, "spool-1")
	end := wantEnd(t, recs, protocol.StatusError, anyCode)
	if !strings.Contains(end.Message, "no space left on device") || !strings.Contains(end.Message, "spool") {
		t.Errorf("end message %q, want it to name the spool problem", end.Message)
	}
	if len(recs) != 2 {
		t.Errorf("records:\n%s\nwant start and end only: nothing is tried between the first failure and the end", dump(recs))
	}
	wantGroupGone(t, startOf(t, recs).PID)
	e.wantDirGone(t, "spool-1")
}

// The end of a job stopped by a full spool must reach the spool once it has room: tried only
// once, it was lost whenever the disk was still full, and the job stayed running at the app for
// good (found by the chaos harness, internal/chaos, seed 20261203).
func TestSpoolFullEndIsRetriedUntilTaken(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, func(c *jobs.Config) { c.KillGrace = time.Second })
	var endTries atomic.Int32
	e.rec.fail = func(job, kind string) error {
		switch kind {
		case protocol.KindStart:
			return nil
		case protocol.KindEnd:
			if endTries.Add(1) < 3 {
				return errors.New("write spool: no space left on device")
			}
			return nil
		}
		return errors.New("write spool: no space left on device")
	}
	e.start(t, jobStart("spool-end-1", "sleep.yml"))
	recs := e.rec.waitEnd(t, "spool-end-1")
	end := wantEnd(t, recs, protocol.StatusError, anyCode)
	if !strings.Contains(end.Message, "spool") {
		t.Errorf("end message %q, want it to name the spool", end.Message)
	}
	if n := endTries.Load(); n != 3 {
		t.Errorf("the end was tried %d times, want 3: twice refused, then taken", n)
	}
}

// A drain whose grace runs out stops the retries of an end the spool never takes, so the RTE
// can stop; the job keeps no end (the next start's restore ends it abandoned).
func TestDrainGivesUpAnEndTheSpoolRefuses(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, func(c *jobs.Config) { c.KillGrace = time.Second })
	var endTried atomic.Bool
	e.rec.fail = func(job, kind string) error {
		if kind == protocol.KindStart {
			return nil
		}
		if kind == protocol.KindEnd {
			endTried.Store(true)
		}
		return errors.New("write spool: no space left on device")
	}
	e.start(t, jobStart("spool-end-2", "sleep.yml"))
	testenv.Eventually(t, time.Minute, "the job's end is tried", endTried.Load)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.m.Drain(ctx, 0); err != nil {
		t.Fatalf("Drain = %v, want nil: the end retries must stop when the drain gives up", err)
	}
	if recs := e.rec.records("spool-end-2"); len(recs) != 1 || recs[0].Kind != protocol.KindStart {
		t.Errorf("records:\n%s\nwant the start only", dump(recs))
	}
}

func TestAnsibleVersion(t *testing.T) {
	requireAnsible(t)
	v, err := jobs.AnsibleVersion(context.Background(), "ansible-playbook")
	if err != nil {
		t.Fatalf("AnsibleVersion: %v", err)
	}
	parts := strings.Split(v, ".")
	if len(parts) < 2 || parts[0] == "" {
		t.Errorf("AnsibleVersion = %q, want a dotted version such as 2.14.18", v)
	}
	if _, err := jobs.AnsibleVersion(context.Background(), filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Errorf("AnsibleVersion of a missing binary = nil error, want one")
	}
}

// TestSecretsFlagsAndSplitSecret uses the fake child: it reports the command line and the
// password files, and writes the become password in two halves 300ms apart, so the halves fall
// in different reads and batches.
func TestSecretsFlagsAndSplitSecret(t *testing.T) {
	t.Parallel()
	const becomePW = "become-pw-split-9f3a7c21"
	e := newTestEnv(t, fakeConfig)
	js := fakeJob("args-1", "args")
	js.Secrets = map[string]string{"become_password": seal(t, "args-1", becomePW)}
	js.Extravars = json.RawMessage(`{"a": 1}`)
	js.Limit = "web*"
	js.Tags = []string{"a", "b"}
	js.SkipTags = []string{"c"}
	js.Check, js.Diff, js.Verbosity, js.Forks = true, true, 3, 7
	e.start(t, js)
	recs := e.rec.waitEnd(t, "args-1")
	wantEnd(t, recs, protocol.StatusSuccess, 0)
	out := outputText(t, recs)

	jobDir := filepath.Join(e.work, "args-1", ".rte")
	wantArgs := []string{
		filepath.Join(mustAbs(t, "testdata/playbooks"), "success.yml"),
		"--inventory=" + filepath.Join(mustAbs(t, "testdata/repo"), "hosts"),
		"--limit=web*", "--tags=a,b", "--skip-tags=c", "--check", "--diff", "-vvv", "--forks=7",
		"--extra-vars=@" + filepath.Join(jobDir, "extravars.json"),
		"--become-password-file=" + filepath.Join(jobDir, "become_password"),
	}
	if want := "args: " + strings.Join(wantArgs, " ") + "\n"; !strings.Contains(out, want) {
		t.Errorf("command line:\n%s\nwant:\n%s", firstLine(out), want)
	}
	for _, want := range []string{
		"file --become-password-file mode 600 sha256 " + sha256hex(becomePW),
		"file --extra-vars mode 600 sha256 " + sha256hex(`{"a": 1}`),
		"split secret: [********] done",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q; output:\n%s", want, out)
		}
	}
	for _, r := range recs {
		if strings.Contains(string(r.Data), becomePW[:len(becomePW)/2]) {
			t.Errorf("record %d (%s) holds half of the secret: %.300s", r.Seq, r.Kind, r.Data)
		}
	}
	events := eventsOf(t, recs)
	if len(events) != 1 || !strings.Contains(string(events[0]), `"msg":"********"`) {
		t.Errorf("events = %s, want the one event with its secret masked", events)
	}
}

// A child that ignores SIGTERM is killed KillGrace later, and the job still ends canceled.
func TestKillAfterGrace(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, func(c *jobs.Config) {
		fakeConfig(c)
		c.KillGrace = 200 * time.Millisecond
	})
	e.start(t, fakeJob("stubborn-1", "ignore-term"))
	e.rec.waitFor(t, "stubborn-1", "the child to ignore SIGTERM", func(r []protocol.Record) bool {
		return strings.Contains(outputText(t, r), "ignoring SIGTERM")
	})
	e.m.Cancel("stubborn-1")
	recs := e.rec.waitEnd(t, "stubborn-1")
	wantEnd(t, recs, protocol.StatusCanceled, 128+9)
	logs := strings.Join(logMessages(t, recs), "\n")
	if !strings.Contains(logs, "did not exit within 200ms of SIGTERM; sent SIGKILL") {
		t.Errorf("log records lack the escalation to SIGKILL; logs:\n%s", logs)
	}
	wantGroupGone(t, startOf(t, recs).PID)
}

func TestStartRefusesInvalidJobs(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	sealedForOther := seal(t, "another-job", "pw")
	tests := []struct {
		name string
		edit func(*protocol.JobStart)
		want string // in the refusal's message
	}{
		{"bad job id", func(js *protocol.JobStart) { js.Job = "a/b" }, "job"},
		{"playbook with ..", func(js *protocol.JobStart) { js.Playbook = "../x.yml" }, `contains ".."`},
		{"absolute playbook", func(js *protocol.JobStart) { js.Playbook = "/etc/passwd" }, "is absolute"},
		{"missing playbook", func(js *protocol.JobStart) { js.Playbook = "nope.yml" }, "does not exist"},
		{"inventory outside", func(js *protocol.JobStart) { js.Inventories = []string{"../../go.mod"} }, "inventories[0]"},
		{"bundles in local mode", func(js *protocol.JobStart) {
			js.Files = &protocol.JobFiles{Playbooks: protocol.BundleRef{Hash: "sha256:" + strings.Repeat("a", 64)}}
		}, "RTE_FILES=local"},
		{"env overrides the plugin", func(js *protocol.JobStart) { js.Env = map[string]string{"ANSIBLE_CALLBACKS_ENABLED": "x"} }, "sets this itself"},
		{"env overrides the events fd", func(js *protocol.JobStart) { js.Env = map[string]string{"AF_EVENTS_FD": "1"} }, "sets this itself"},
		{"env overrides the temp dir", func(js *protocol.JobStart) { js.Env = map[string]string{"ANSIBLE_LOCAL_TEMP": "/tmp"} }, "sets this itself"},
		{"env bad name", func(js *protocol.JobStart) { js.Env = map[string]string{"A=B": "x"} }, "not a variable name"},
		{"env moves the log", func(js *protocol.JobStart) { js.Env = map[string]string{"ANSIBLE_LOG_PATH": "/tmp/x"} }, "env.ANSIBLE_LOG_PATH: refused because it names a path on the RTE"},
		{"env chooses the config", func(js *protocol.JobStart) { js.Env = map[string]string{"ANSIBLE_CONFIG": "/tmp/x.cfg"} }, "list ANSIBLE_CONFIG in RTE_JOB_ENV_ALLOW"},
		{"env loads plugins", func(js *protocol.JobStart) { js.Env = map[string]string{"ANSIBLE_ACTION_PLUGINS": "/tmp"} }, "plugins are loaded"},
		{"env loads python code", func(js *protocol.JobStart) { js.Env = map[string]string{"PYTHONPATH": "/tmp"} }, "env.PYTHONPATH"},
		{"env preloads a library", func(js *protocol.JobStart) { js.Env = map[string]string{"LD_PRELOAD": "/tmp/x.so"} }, "dynamic linker"},
		{"env job dir dot-dot", func(js *protocol.JobStart) { js.Job = ".." }, `not "." or ".."`},
		{"limit reads a file", func(js *protocol.JobStart) { js.Limit = "@/etc/passwd" }, "contains @"},
		{"timeout overflows", func(js *protocol.JobStart) { js.TimeoutS = 10000000000 }, "timeout_s"},
		{"env NUL value", func(js *protocol.JobStart) { js.Env = map[string]string{"A": "x\x00y"} }, "NUL"},
		{"tag with comma", func(js *protocol.JobStart) { js.Tags = []string{"a,b"} }, "tags[0]"},
		{"secret sealed for another job", func(js *protocol.JobStart) { js.Secrets = map[string]string{"vault_password": sealedForOther} }, "secrets.vault_password"},
		{"secret not base64", func(js *protocol.JobStart) { js.Secrets = map[string]string{"become_password": "%%%"} }, "secrets.become_password"},
		{"unknown secret", func(js *protocol.JobStart) { js.Secrets = map[string]string{"ssh_key": "x"} }, "secrets"},
		{"image under process", func(js *protocol.JobStart) { js.Image = "rte:dev" }, "image: this RTE runs each job as a process on its host (RTE_ENGINE=process)"},
		{"image not a reference", func(js *protocol.JobStart) { js.Image = "rte:dev --privileged" }, `image: "rte:dev --privileged" is not an image reference`},
	}
	for _, tt := range tests {
		js := jobStart("refused-1", "success.yml")
		tt.edit(js)
		err := e.m.Start(js)
		var r *jobs.Refusal
		if !errors.As(err, &r) || r.Code != protocol.RefusedInvalid || !strings.Contains(r.Message, tt.want) {
			t.Errorf("%s: Start = %v, want an %q refusal that mentions %q", tt.name, err, protocol.RefusedInvalid, tt.want)
		}
	}
	if len(e.m.Running()) != 0 || e.rec.Has("refused-1") {
		t.Errorf("a refused job runs or has records")
	}
}

func TestUnhealthySpoolRefusesFull(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, func(c *jobs.Config) {
		c.Healthy = func() error { return errors.New("spool volume is full") }
	})
	err := e.m.Start(jobStart("sick-1", "success.yml"))
	var r *jobs.Refusal
	if !errors.As(err, &r) || r.Code != protocol.RefusedFull || !strings.Contains(r.Message, "spool volume is full") {
		t.Errorf("Start with an unhealthy spool = %v, want a %q refusal naming the spool problem", err, protocol.RefusedFull)
	}
}

// failingFiles is a Preparer that fails, or blocks until the job's context ends.
type failingFiles struct{ block bool }

func (f failingFiles) Prepare(ctx context.Context, _ *protocol.JobStart, dir string) (jobs.Workspace, error) {
	if _, err := os.Stat(dir); err != nil {
		return jobs.Workspace{}, err
	}
	if f.block {
		<-ctx.Done()
		return jobs.Workspace{}, ctx.Err()
	}
	return jobs.Workspace{}, errors.New("bundle sha256:abc is corrupt")
}

func TestPrepareFailureEndsError(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, func(c *jobs.Config) { c.Files = failingFiles{} })
	e.start(t, jobStart("prep-1", "success.yml"))
	recs := e.rec.waitEnd(t, "prep-1")
	end := wantEnd(t, recs, protocol.StatusError, -1)
	if !strings.Contains(end.Message, "prepare files: bundle sha256:abc is corrupt") {
		t.Errorf("end message %q, want the Preparer's error", end.Message)
	}
	if len(recs) != 1 {
		t.Errorf("records of a job that never started:\n%s\nwant only the end", dump(recs))
	}
	e.wantDirGone(t, "prep-1")
}

func TestCancelWhilePreparing(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, func(c *jobs.Config) { c.Files = failingFiles{block: true} })
	e.start(t, jobStart("prep-2", "success.yml"))
	if !e.m.Cancel("prep-2") {
		t.Fatal("Cancel of a preparing job = false, want true")
	}
	recs := e.rec.waitEnd(t, "prep-2")
	wantEnd(t, recs, protocol.StatusCanceled, -1)
	e.wantDirGone(t, "prep-2")
}

func TestLocalFilesRefusesPathsOutsideRoot(t *testing.T) {
	t.Parallel()
	root, repo, outside := t.TempDir(), t.TempDir(), t.TempDir()
	for _, p := range []string{filepath.Join(root, "site.yml"), filepath.Join(repo, "hosts"), filepath.Join(outside, "secret.yml")} {
		if err := os.WriteFile(p, []byte("- hosts: all\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(root, "sub"), 0o700))
	must(os.Symlink(filepath.Join(outside, "secret.yml"), filepath.Join(root, "escape.yml")))
	must(os.Symlink(outside, filepath.Join(root, "sub", "out")))
	must(os.Symlink("site.yml", filepath.Join(root, "alias.yml")))
	lf := jobs.LocalFiles{AnsiblePath: root, RepoPath: repo}

	tests := []struct {
		playbook string
		inv      []string
		want     string // "" means accepted
	}{
		{"site.yml", []string{"hosts"}, ""},
		{"alias.yml", nil, ""},
		{"./site.yml", nil, ""},
		{"../x", nil, `contains ".."`},
		{"sub/../../x", nil, `contains ".."`},
		{filepath.Join(root, "site.yml"), nil, "is absolute"},
		{"escape.yml", nil, "outside ANSIBLE_PATH"},
		{"sub/out/secret.yml", nil, "outside ANSIBLE_PATH"},
		{"sub", nil, "is a directory"},
		{"missing.yml", nil, "does not exist"},
		{"site.yml", []string{"../hosts"}, `contains ".."`},
		{"site.yml", []string{"/etc/hosts"}, "is absolute"},
	}
	for _, tt := range tests {
		js := &protocol.JobStart{Job: "j", Playbook: tt.playbook, Inventories: tt.inv}
		err := lf.Validate(js)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("Validate(%q, %v) = %v, want accepted", tt.playbook, tt.inv, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("Validate(%q, %v) = %v, want an error with %q", tt.playbook, tt.inv, err, tt.want)
		}
	}
	ws, err := lf.Prepare(context.Background(), &protocol.JobStart{Job: "j", Playbook: "site.yml", Inventories: []string{"hosts"}}, t.TempDir())
	if err != nil || ws.Dir != root || ws.Playbook != filepath.Join(root, "site.yml") || !slices.Equal(ws.Inventories, []string{filepath.Join(repo, "hosts")}) {
		t.Errorf("Prepare = %+v, %v; want dir %s, absolute playbook and inventory", ws, err, root)
	}
}

func TestNewReportsEveryProblem(t *testing.T) {
	_, err := jobs.New(jobs.Config{MaxJobs: -1, AnsiblePlaybook: "/nonexistent/ansible-playbook"})
	if err == nil {
		t.Fatal("New with an empty config = nil error")
	}
	for _, want := range []string{"Recorder", "Files", "Token", "WorkDir", "PluginDir", "MaxJobs", "/nonexistent/ansible-playbook"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New's error lacks %q: %v", want, err)
		}
	}
}
