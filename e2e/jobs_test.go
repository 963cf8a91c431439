package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// TestJobsEndToEnd runs real playbooks through the real app half and the real RTE: success,
// failure, an unreachable host, no_log and a masked secret, timeout and cancel. One rig serves
// them all, since a rig costs an RTE start and a handshake.
func TestJobsEndToEnd(t *testing.T) {
	r := newJobRig(t)

	t.Run("success", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"who":"e2e"}`)})
		end := r.waitEnd(j.ID, 2*time.Minute)
		s := r.story(j.ID)
		if end.Status != protocol.StatusSuccess || s.End.Status != protocol.StatusSuccess || s.End.ExitCode != 0 {
			t.Fatalf("job %+v, end record %+v, want success", end, s.End)
		}
		if s.Records[0].Kind != protocol.KindStart {
			t.Fatalf("first record is %s, want start", s.Records[0].Kind)
		}
		if !strings.Contains(s.Output, "hello e2e") || !strings.Contains(s.Output, "PLAY RECAP") {
			t.Fatalf("output lacks the playbook's text:\n%s", s.Output)
		}
		for _, ev := range []string{"playbook_on_start", "playbook_on_task_start", "runner_on_ok", "playbook_on_stats"} {
			if !s.hasEvent(ev) {
				t.Fatalf("no %s event; got %v", ev, s.eventNames())
			}
		}
	})

	t.Run("failure", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "fail.yml", Inventories: []string{"local.ini"}})
		end := r.waitEnd(j.ID, 2*time.Minute)
		s := r.story(j.ID)
		if end.Status != protocol.StatusFailed || s.End.ExitCode != 2 {
			t.Fatalf("job %+v end %+v, want failed with exit 2", end, s.End)
		}
		if !s.hasEvent("runner_on_failed") || !strings.Contains(s.Output, "failing on purpose") {
			t.Fatalf("failure not visible: events %v\n%s", s.eventNames(), s.Output)
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"unreachable.ini"},
			Env: map[string]string{"ANSIBLE_HOST_KEY_CHECKING": "False"}})
		end := r.waitEnd(j.ID, 2*time.Minute)
		s := r.story(j.ID)
		if end.Status != protocol.StatusFailed || s.End.ExitCode != 4 {
			t.Fatalf("job %+v end %+v, want failed with exit 4", end, s.End)
		}
		if !s.hasEvent("runner_on_unreachable") {
			t.Fatalf("no runner_on_unreachable event: %v", s.eventNames())
		}
	})

	t.Run("no_log and a masked secret", func(t *testing.T) {
		const secret = "vault-pw-7c1e9d0f"
		j := r.submit(protocol.JobStart{Playbook: "secrets.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"marker":"m41k","leak":"` + secret + `"}`),
			Secrets:   map[string]string{"vault_password": secret}})
		r.waitEnd(j.ID, 2*time.Minute)
		s := r.story(j.ID)
		for _, rec := range s.Records {
			if strings.Contains(string(rec.Data), secret) {
				t.Fatalf("the secret reached the app in %s record %d: %s", rec.Kind, rec.Seq, rec.Data)
			}
			if strings.Contains(string(rec.Data), "nolog-value-m41k") {
				t.Fatalf("a no_log value reached the app in %s record %d", rec.Kind, rec.Seq)
			}
		}
		if !strings.Contains(s.Output, "the value is ********") {
			t.Fatalf("the masked secret is not shown as ********:\n%s", s.Output)
		}
		if stored, _ := r.App.GetJob(t.Context(), j.ID); len(stored.Start.Secrets) != 0 {
			t.Fatalf("the app stored the job's sealed or plain secrets: %v", stored.Start.Secrets)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"seconds":"303"}`), TimeoutS: 3})
		end := r.waitEnd(j.ID, 2*time.Minute)
		if end.Status != protocol.StatusTimeout {
			t.Fatalf("job %+v, want timeout", end)
		}
		r.story(j.ID)
		waitGone(t, "sleep 303")
	})

	t.Run("cancel", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"seconds":"301"}`)})
		r.waitState(j.ID, app.JobRunning, time.Minute)
		waitPresent(t, "sleep 301")
		if err := r.App.Cancel(t.Context(), j.ID); err != nil {
			t.Fatal(err)
		}
		end := r.waitEnd(j.ID, time.Minute)
		if end.Status != protocol.StatusCanceled {
			t.Fatalf("job %+v, want canceled", end)
		}
		r.story(j.ID)
		waitGone(t, "sleep 301")
	})
}

// waitPresent waits for a process whose command line holds marker.
func waitPresent(t *testing.T, marker string) {
	t.Helper()
	if !testenv.Poll(time.Minute, func() bool { return len(processesWith(marker)) > 0 }) {
		t.Fatalf("no process %q started", marker)
	}
}

// waitGone waits until no process holds marker: the whole process group was stopped.
func waitGone(t *testing.T, marker string) {
	t.Helper()
	var left []string
	if !testenv.Poll(30*time.Second, func() bool { left = processesWith(marker); return len(left) == 0 }) {
		t.Fatalf("processes %v (%q) outlived their job", left, marker)
	}
}
