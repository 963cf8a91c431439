package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/refapptest"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// storeRun stores a whole run of job as a runner would send it: start, output, the events of
// the captured example run in two batches, and an end with status.
func storeRun(t *testing.T, ta *refapptest.App, job, status string) {
	t.Helper()
	events := refapptest.ReadEvents(t, "../summary/testdata/site.events.jsonl")
	half := len(events) / 2
	exitCode := 0
	if status != protocol.StatusSuccess {
		exitCode = 2
	}
	ta.StoreRecords(t, job,
		refapptest.Record(t, 1, protocol.KindStart, protocol.StartData{PID: 4242, Instance: "rte-host", Playbook: "site.yml"}),
		refapptest.Record(t, 2, protocol.KindOutput, protocol.OutputData{Text: "PLAY [Demo play] ****\n"}),
		refapptest.Record(t, 3, protocol.KindEvents, protocol.EventsData{Events: events[:half]}),
		refapptest.Record(t, 4, protocol.KindLog, protocol.LogData{Level: protocol.LevelWarn, Message: "a word from the rte"}),
		refapptest.Record(t, 5, protocol.KindEvents, protocol.EventsData{Events: events[half:]}),
		refapptest.Record(t, 6, protocol.KindOutput, protocol.OutputData{Text: "PLAY RECAP ****\n"}),
		refapptest.Record(t, 7, protocol.KindEnd, protocol.EndData{Status: status, ExitCode: exitCode, Message: "the end"}),
	)
}

func TestRunNoFollowThenFollow(t *testing.T) {
	ta := refapptest.StartApp(t)
	code, stdout, stderr := runCLI(t, ta, "run", "--runner", "r1", "--playbook", "site.yml", "--inventory", "hosts.yml",
		"--inventory", "more.yml", "--extra-vars", `{"x": 1}`, "--tags", "a,b", "--check", "--env", "K=v=w", "--no-follow")
	if code != ExitOK {
		t.Fatalf("run --no-follow: exit %d, stderr %s; want 0", code, stderr)
	}
	id := strings.TrimSpace(stdout)
	j, err := ta.App.GetJob(context.Background(), id)
	if err != nil {
		t.Fatalf("run --no-follow printed %q, not a job id: %v", stdout, err)
	}
	s := j.Start
	if s.Playbook != "site.yml" || strings.Join(s.Inventories, ",") != "hosts.yml,more.yml" || string(s.Extravars) != `{"x":1}` ||
		strings.Join(s.Tags, ",") != "a,b" || !s.Check || s.Env["K"] != "v=w" || s.TimeoutS != 3600 {
		t.Errorf("job.start = %+v, want the flags' values and the default timeout of 3600 s", s)
	}

	storeRun(t, ta, id, protocol.StatusSuccess)
	code, stdout, stderr = runCLI(t, ta, "follow", id)
	if code != ExitOK {
		t.Fatalf("follow: exit %d, stderr %s; want 0", code, stderr)
	}
	for _, want := range []string{"PLAY [Demo play] ****\nPLAY RECAP ****\n", "Hosts and tasks", "TASK Name each colour", "RECAP", "job " + id + " on r1: success: the end"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("follow's output lacks %q:\n%s", want, stdout)
		}
	}
	for _, want := range []string{"rte: site.yml started on rte-host (pid 4242)", "rte warn: a word from the rte"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("follow's notes lack %q:\n%s", want, stderr)
		}
	}
}

func TestFollowExitStatuses(t *testing.T) {
	ta := refapptest.StartApp(t)
	for _, tc := range []struct {
		status string
		code   int
	}{
		{protocol.StatusSuccess, ExitOK},
		{protocol.StatusFailed, ExitFailed},
		{protocol.StatusCanceled, ExitNotEnded},
		{protocol.StatusTimeout, ExitNotEnded},
		{protocol.StatusAbandoned, ExitNotEnded},
		{protocol.StatusError, ExitNotEnded},
	} {
		j := ta.Submit(t, `{"runner":"r1","playbook":"site.yml"}`)
		storeRun(t, ta, j.ID, tc.status)
		code, stdout, stderr := runCLI(t, ta, "follow", j.ID)
		if code != tc.code || !strings.Contains(stdout, ": "+tc.status) {
			t.Errorf("follow a job that ended %s: exit %d, want %d\nstdout %s\nstderr %s", tc.status, code, tc.code, stdout, stderr)
		}
	}
}

// TestRunInterruptCancelsTheJob follows a job that stays queued; an interrupt cancels it, the
// stream ends with it canceled, and the exit status says so.
func TestRunInterruptCancelsTheJob(t *testing.T) {
	ta := refapptest.StartApp(t)
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	var stdout, stderr refapptest.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"run", "--runner", "r1", "--playbook", "site.yml"},
			[]string{"APP_ADMIN_TOKEN=" + refapptest.AdminToken, "APP_URL=" + ta.URL}, &stdout, &stderr)
	}()
	queued := testenv.Poll(30*time.Second, func() bool {
		select {
		case code := <-done:
			t.Fatalf("run ended early with %d: %s", code, stderr.String())
		default:
		}
		return strings.Contains(stderr.String(), "queued on runner r1")
	})
	if !queued {
		t.Fatalf("run never said the job was queued: %s", stderr.String())
	}
	interrupt()
	select {
	case code := <-done:
		if code != ExitNotEnded || !strings.Contains(stdout.String(), ": canceled") || !strings.Contains(stderr.String(), "interrupted: canceling job") {
			t.Errorf("interrupted run: exit %d, want %d with the job canceled\nstdout %s\nstderr %s", code, ExitNotEnded, stdout.String(), stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("run did not end after the interrupt: %s", stderr.String())
	}
	jobs, err := ta.App.ListJobs(context.Background(), app.JobFilter{})
	if err != nil || len(jobs) != 1 || jobs[0].Status != protocol.StatusCanceled {
		t.Errorf("jobs after the interrupt = %+v (%v), want one, canceled", jobs, err)
	}
}

func TestRunSendsSecretsFromFiles(t *testing.T) {
	ta := refapptest.StartApp(t)
	dir := t.TempDir()
	vault := filepath.Join(dir, "vault")
	if err := os.WriteFile(vault, []byte("vault-secret-must-not-leak\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, ta, "run", "--runner", "r1", "--playbook", "site.yml", "--vault-password-file", vault, "--no-follow")
	if code != ExitOK {
		t.Fatalf("run: exit %d, stderr %s", code, stderr)
	}
	j, err := ta.App.GetJob(context.Background(), strings.TrimSpace(stdout))
	if err != nil || strings.Join(j.SecretNames, ",") != "vault_password" {
		t.Errorf("job = %+v (%v), want it to carry vault_password", j, err)
	}
	if strings.Contains(ta.Logs.String(), "vault-secret") || strings.Contains(stderr, "warning") {
		t.Errorf("the secret reached the log, or a loopback app got a plain-http warning:\nlog %s\nstderr %s", ta.Logs.String(), stderr)
	}
}

func TestRunnersAndJobsCommands(t *testing.T) {
	ta := refapptest.StartApp(t)
	code, stdout, stderr := runCLI(t, ta, "runners")
	if code != ExitOK || !strings.Contains(stdout, "r1") || !strings.Contains(stdout, protocol.TokenFingerprint(refapptest.RunnerToken)) {
		t.Errorf("runners: exit %d, want 0 and a row for r1 with its token fingerprint\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, ta, "runners", "--json")
	var list api.RunnersResponse
	if code != ExitOK || json.Unmarshal([]byte(stdout), &list) != nil || len(list.Runners) != 1 {
		t.Errorf("runners --json: exit %d, want the JSON list: %s", code, stdout)
	}
	j := ta.Submit(t, `{"runner":"r1","playbook":"deploy.yml"}`)
	code, stdout, _ = runCLI(t, ta, "jobs", "--runner", "r1")
	if code != ExitOK || !strings.Contains(stdout, j.ID) || !strings.Contains(stdout, "deploy.yml") {
		t.Errorf("jobs: exit %d, want a row for %s:\n%s", code, j.ID, stdout)
	}
	code, stdout, _ = runCLI(t, ta, "cancel", j.ID)
	if code != ExitOK || !strings.Contains(stdout, "canceled") {
		t.Errorf("cancel: exit %d: %s", code, stdout)
	}
	code, _, stderr = runCLI(t, ta, "cancel", j.ID)
	if code != ExitTrouble || !strings.Contains(stderr, "409") {
		t.Errorf("cancel an ended job: exit %d, want %d with the app's 409: %s", code, ExitTrouble, stderr)
	}
	code, _, stderr = runCLI(t, ta, "approve", "r1", "--fingerprint", "abcd-ef12")
	if code != ExitTrouble || !strings.Contains(stderr, "no certificate waiting") {
		t.Errorf("approve with a fingerprint nothing matches: exit %d, want %d: %s", code, ExitTrouble, stderr)
	}
	code, _, stderr = runCLI(t, ta, "approve", "r1", "--sha256", "0000000000000000000000000000000000000000000000000000000000000000")
	if code != ExitTrouble || !strings.Contains(stderr, "no certificate is waiting") {
		t.Errorf("approve with a SHA-256 nothing matches: exit %d, want %d: %s", code, ExitTrouble, stderr)
	}
	code, stdout, stderr = runCLI(t, ta, "clear-waiting", "--reason", "test")
	if code != ExitOK || !strings.Contains(stdout, "no registration request was waiting") {
		t.Errorf("clear-waiting with nothing waiting: exit %d: %s %s", code, stdout, stderr)
	}
	if r := ta.Runner(t, "r1"); r.State != app.StateApproved {
		t.Errorf("clear-waiting touched approved runner r1: %s", r.State)
	}
	code, stdout, stderr = runCLI(t, ta, "reject", "--reason", "test", "r1")
	if code != ExitOK || !strings.Contains(stdout, "rejected runner r1") {
		t.Errorf("reject: exit %d: %s %s", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, ta, "runners")
	if code != ExitOK || !strings.Contains(stdout, "no runners") {
		t.Errorf("runners after the reject: exit %d: %s", code, stdout)
	}
}
