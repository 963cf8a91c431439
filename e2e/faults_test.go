package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

var lineRE = regexp.MustCompile(`"line-(\d+)"`)

// checkLines checks that the output holds line-1..line-n exactly once each, in order.
func checkLines(t *testing.T, output string, n int) {
	t.Helper()
	got := lineRE.FindAllStringSubmatch(output, -1)
	if len(got) != n {
		t.Fatalf("output holds %d numbered lines, want %d", len(got), n)
	}
	for i, m := range got {
		if v, _ := strconv.Atoi(m[1]); v != i+1 {
			t.Fatalf("line %d of the output is line-%d: lost, repeated or out of order", i+1, v)
		}
	}
}

// TestSocketDropsLoseNothing cuts the app's socket 20 times while a job prints 100,000 lines,
// then counts: every line stored exactly once, in order, every seq once.
func TestSocketDropsLoseNothing(t *testing.T) {
	r := newJobRig(t)
	const lines = 100000
	j := r.submit(protocol.JobStart{Playbook: "lines.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(fmt.Sprintf(`{"lines":%d,"batches":20,"pause":1}`, lines))})
	r.waitState(j.ID, app.JobRunning, time.Minute)

	drops := 0
	for drops < 20 {
		r.waitConnected()
		// Let some records flow on the fresh socket before cutting it again.
		time.Sleep(150 * time.Millisecond)
		if r.Proxy.Drop() > 0 {
			drops++
		}
	}
	end := r.waitEnd(j.ID, 3*time.Minute)
	if end.Status != protocol.StatusSuccess {
		t.Fatalf("job %+v, want success", end)
	}
	s := r.story(j.ID)
	checkLines(t, s.Output, lines)
	t.Logf("%d drops; %d records, %d bytes of output stored once each", drops, len(s.Records), len(s.Output))
}

// TestKillRTEMidJob kills the RTE with SIGKILL while a job runs, damages the tail of the job's
// spool file as a crash mid-write would, and restarts the RTE: the job ends abandoned, and
// everything spooled before the kill reaches the app exactly once.
func TestKillRTEMidJob(t *testing.T) {
	r := newJobRig(t)
	j := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(`{"seconds":"304"}`)})
	r.waitState(j.ID, app.JobRunning, time.Minute)
	waitPresent(t, "sleep 304")
	// Wait until the job has told the app something beyond its start.
	testenv.Poll(time.Minute, func() bool { return len(r.records(j.ID)) >= 2 })
	before := r.records(j.ID)

	r.RTE.Signal(syscall.SIGKILL)
	r.RTE.Wait(30 * time.Second)

	// A torn last record: half a frame header appended, as a crash mid-append leaves it.
	spoolFile := filepath.Join(r.dir, "spool", j.ID+".spool")
	f, err := os.OpenFile(spoolFile, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("the job's spool file: %v", err)
	}
	_, _ = f.Write([]byte{0, 0, 1})
	f.Close()

	r.Restart()
	end := r.waitEnd(j.ID, 2*time.Minute)
	if end.Status != protocol.StatusAbandoned {
		t.Fatalf("job %+v, want abandoned", end)
	}
	s := r.story(j.ID)
	for i, rec := range before {
		if string(s.Records[i].Data) != string(rec.Data) || s.Records[i].Seq != rec.Seq {
			t.Fatalf("record %d changed across the restart: %s then %s", rec.Seq, rec.Data, s.Records[i].Data)
		}
	}
	if !strings.Contains(r.RTE.Log(), "spool") {
		t.Logf("RTE log after restart:\n%s", testenv.Tail(r.RTE.Log(), 20))
	}
	// The orphaned playbook must not outlive its job.
	waitGone(t, "sleep 304")
}

// TestDrainOnSIGTERM sends SIGTERM while a job runs: /ready turns 503, the job gets
// RTE_DRAIN_SECONDS and is then stopped and ends abandoned, and the RTE exits 0 with the end
// spooled; the app has it once the RTE is back.
func TestDrainOnSIGTERM(t *testing.T) {
	r := newJobRig(t)
	j := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(`{"seconds":"305"}`)})
	r.waitState(j.ID, app.JobRunning, time.Minute)
	waitPresent(t, "sleep 305")
	r.RTE.Signal(syscall.SIGTERM)
	sawNotReady := false
	for i := 0; i < 100; i++ {
		if code, _ := r.RTE.Probe("/ready"); code == 503 {
			sawNotReady = true
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !sawNotReady {
		t.Fatal("/ready did not turn 503 on SIGTERM")
	}
	if code := r.RTE.Wait(time.Minute); code != 0 {
		t.Fatalf("exit status %d after a drain, want 0", code)
	}
	waitGone(t, "sleep 305")
	r.Restart()
	end := r.waitEnd(j.ID, time.Minute)
	if end.Status != protocol.StatusAbandoned {
		t.Fatalf("job %+v, want abandoned after the drain ran out", end)
	}
	r.story(j.ID)
}

// TestFullSpoolDisk puts the spool on a small tmpfs and runs a job that prints more than fits:
// the job fails with a clear end where there is room for it, /ready says why, and new jobs are
// refused while the spool cannot be written.
func TestFullSpoolDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	spoolDir := filepath.Join(dir, "small")
	if err := os.MkdirAll(spoolDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", spoolDir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s)", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", spoolDir).Run() })

	r := newJobRig(t, withRTEEnv("RTE_SPOOL_PATH="+spoolDir))
	// Keep the app from acking, so nothing is trimmed and the spool must fill: stop its loop.
	r.Stop()
	j := r.submit(protocol.JobStart{Playbook: "lines.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(`{"lines":40000,"batches":1,"pause":0}`)})
	_ = j
	// Nothing dispatches while the app is stopped; send the job by hand over a raw socket.
	ws := dialRTE(t, r.RTE, testToken)
	defer ws.Close()
	_ = readMsg(t, ws, 10*time.Second)
	send(t, ws, &protocol.Welcome{Protocol: protocol.Version, Node: "raw", Approved: true})
	send(t, ws, &protocol.JobStart{Job: "fill-1", Playbook: "lines.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(`{"lines":40000,"batches":1,"pause":0}`)})
	var end *protocol.EndData
	deadline := time.Now().Add(2 * time.Minute)
	for end == nil && time.Now().Before(deadline) {
		m := readMsg(t, ws, time.Minute)
		if rec, ok := m.(*protocol.Record); ok && rec.Kind == protocol.KindEnd {
			var d protocol.EndData
			mustJSON(t, rec.Data, &d)
			end = &d
		}
	}
	if end == nil {
		t.Fatalf("no end record for the job that filled the spool\n%s", testenv.Tail(r.RTE.Log(), 30))
	}
	if end.Status != protocol.StatusError || !strings.Contains(end.Message, "spool") {
		t.Fatalf("end %+v, want status error naming the spool", end)
	}
	code, body := r.RTE.Probe("/ready")
	if code != 503 || !strings.Contains(body, "spool") {
		t.Fatalf("/ready = %d %q while the spool is full, want 503 naming the spool", code, body)
	}
	send(t, ws, &protocol.JobStart{Job: "fill-2", Playbook: "hello.yml", Inventories: []string{"local.ini"}})
	for {
		m := readMsg(t, ws, time.Minute)
		if ref, ok := m.(*protocol.JobRefused); ok && ref.Job == "fill-2" {
			if !strings.Contains(ref.Message, "spool") {
				t.Fatalf("refusal %+v does not name the spool", ref)
			}
			break
		}
		if acc, ok := m.(*protocol.JobAccepted); ok && acc.Job == "fill-2" {
			t.Fatal("a job was accepted while the spool cannot be written")
		}
	}
}
