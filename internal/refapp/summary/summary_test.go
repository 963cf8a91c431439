package summary_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/refapp/refapptest"
	"github.com/rte-project/rte/internal/refapp/summary"

	"github.com/rte-project/rte/jobs/afevents"
)

// row is a task's outcome on one host in a compact form for comparing.
type row struct {
	task, host, result string
	ignored            bool
	items              int
	message            string // a substring the message must hold; "" means no message
}

func rows(s *summary.Summary) []row {
	var out []row
	for _, p := range s.Plays {
		for _, task := range p.Tasks {
			name := task.Name
			if task.Handler {
				name = "HANDLER " + name
			}
			for _, h := range task.Hosts {
				out = append(out, row{task: name, host: h.Host, result: h.Result, ignored: h.Ignored, items: h.Items, message: h.Message})
			}
		}
	}
	return out
}

func checkRows(t *testing.T, s *summary.Summary, want []row) {
	t.Helper()
	got := rows(s)
	if len(got) != len(want) {
		t.Fatalf("got %d host rows, want %d:\ngot  %+v\nwant %+v", len(got), len(want), got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		msgOK := (w.message == "" && g.message == "") || (w.message != "" && strings.Contains(g.message, w.message))
		if g.task != w.task || g.host != w.host || g.result != w.result || g.ignored != w.ignored || g.items != w.items || !msgOK {
			t.Errorf("row %d:\ngot  %+v\nwant %+v (message is a substring)", i, g, w)
		}
	}
}

func TestSummaryOfTheExamplePlaybook(t *testing.T) {
	s := summary.Summarize(refapptest.ReadEvents(t, "testdata/site.events.jsonl"))
	if s.Unreadable != 0 {
		t.Errorf("Unreadable = %d, want 0 for a real stream", s.Unreadable)
	}
	if len(s.Plays) != 1 || s.Plays[0].Name != "Demo play" || s.Plays[0].Pattern != "all" {
		t.Fatalf("plays = %+v, want one play \"Demo play\" on all", s.Plays)
	}
	checkRows(t, s, []row{
		{task: "Gathering Facts", host: "localhost", result: summary.ResultOK},
		{task: "Show a few facts", host: "localhost", result: summary.ResultOK},
		{task: "Make a scratch directory", host: "localhost", result: summary.ResultChanged},
		{task: "Write the greeting", host: "localhost", result: summary.ResultChanged},
		{task: "Name each colour", host: "localhost", result: summary.ResultOK, items: 3},
		{task: "Only on Windows hosts (skipped here)", host: "localhost", result: summary.ResultSkipped},
		{task: "Read the greeting back", host: "localhost", result: summary.ResultOK},
		{task: "Say what was done", host: "localhost", result: summary.ResultOK},
		{task: "Remove the scratch directory", host: "localhost", result: summary.ResultChanged},
		{task: "HANDLER Report the greeting changed", host: "localhost", result: summary.ResultOK},
	})
	want := []summary.HostRecap{{Host: "localhost", OK: 9, Changed: 3, Skipped: 1}}
	if fmt.Sprint(s.Recap) != fmt.Sprint(want) {
		t.Errorf("recap = %+v, want %+v", s.Recap, want)
	}
	for _, task := range s.Plays[0].Tasks {
		if task.Duration <= 0 {
			t.Errorf("task %q has no duration; every task of a real run has results after its start", task.Name)
		}
		for _, h := range task.Hosts {
			if h.Duration <= 0 {
				t.Errorf("task %q host %s has no duration; the plugin measures every host result", task.Name, h.Host)
			}
		}
	}

	var out bytes.Buffer
	if err := s.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"Hosts and tasks\n",
		"PLAY Demo play [all]\n",
		"TASK Name each colour",
		"3 items",
		"HANDLER Report the greeting changed",
		"RECAP\n",
		"OK  CHANGED  FAILED  SKIPPED  UNREACHABLE  RESCUED  IGNORED",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the text does not hold %q:\n%s", want, text)
		}
	}
	if !regexp.MustCompile(`(?m)^  localhost\s+9\s+3\s+0\s+1\s+0\s+0\s+0$`).MatchString(text) {
		t.Errorf("the recap row of localhost is not ok=9 changed=3 skipped=1:\n%s", text)
	}
}

func TestSummaryOfFailures(t *testing.T) {
	s := summary.Summarize(refapptest.ReadEvents(t, "testdata/failures.events.jsonl"))
	checkRows(t, s, []row{
		{task: "Reach every host", host: "nowhere", result: summary.ResultUnreachable, message: "port 9: Connection refused"},
		{task: "Reach every host", host: "localhost", result: summary.ResultOK},
		{task: "Fail but ignored", host: "localhost", result: summary.ResultFailed, ignored: true, message: "non-zero return code; rc 1"},
		{task: "Fail inside a block", host: "localhost", result: summary.ResultFailed, message: "block failure"},
		{task: "Rescue it", host: "localhost", result: summary.ResultOK},
		{task: "Loop with a failing item", host: "localhost", result: summary.ResultFailed, items: 2, message: "item b: non-zero return code; rc 1"},
	})
	want := []summary.HostRecap{
		{Host: "localhost", OK: 3, Changed: 1, Failed: 1, Rescued: 1, Ignored: 1},
		{Host: "nowhere", Unreachable: 1},
	}
	if fmt.Sprint(s.Recap) != fmt.Sprint(want) {
		t.Errorf("recap = %+v, want %+v", s.Recap, want)
	}
	var out bytes.Buffer
	if err := s.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"unreachable", "ignored, non-zero return code; rc 1", "2 items, item b: non-zero return code"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the text does not hold %q:\n%s", want, out.String())
		}
	}
}

// TestSummaryToleratesBadAndShuffledEvents feeds the real stream backwards with junk and a
// repeated event mixed in: the summary must come out as from the clean stream.
func TestSummaryToleratesBadAndShuffledEvents(t *testing.T) {
	clean := refapptest.ReadEvents(t, "testdata/failures.events.jsonl")
	var messy []json.RawMessage
	for i := len(clean) - 1; i >= 0; i-- {
		messy = append(messy, clean[i])
	}
	messy = append(messy, clean[5], json.RawMessage(`"just a string"`), json.RawMessage(`{"event":"runner_on_ok"}`), json.RawMessage(`{`))
	got, want := summary.Summarize(messy), summary.Summarize(clean)
	if fmt.Sprint(rows(got)) != fmt.Sprint(rows(want)) || fmt.Sprint(got.Recap) != fmt.Sprint(want.Recap) {
		t.Errorf("shuffled summary differs:\ngot  %+v %+v\nwant %+v %+v", rows(got), got.Recap, rows(want), want.Recap)
	}
	if got.Unreadable != 3 {
		t.Errorf("Unreadable = %d, want 3 (a string, an event without event_data, a cut object)", got.Unreadable)
	}
}

func TestSummaryTextIsSafeForATerminal(t *testing.T) {
	ev := func(counter int, name, parent string, data map[string]any) json.RawMessage {
		b, err := json.Marshal(map[string]any{
			"event": name, "uuid": fmt.Sprintf("u%d", counter), "parent_uuid": parent, "counter": counter,
			"created": time.Date(2026, 12, 2, 10, 0, counter, 0, time.UTC), "event_data": data,
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	s := summary.Summarize([]json.RawMessage{
		ev(1, "playbook_on_play_start", "", map[string]any{"name": "p\x1b[2Jlay", "pattern": "all"}),
		ev(2, "playbook_on_task_start", "u1", map[string]any{"name": "t\nask"}),
		ev(3, "runner_on_failed", "u2", map[string]any{"host": "h\x1b]0;x\x07", "res": map[string]any{"msg": "line one\nFAKE LINE\r\x1b[31m", "rc": 2}}),
	})
	var out bytes.Buffer
	if err := s.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\r\x07") || strings.Contains(out.String(), "\nFAKE LINE") {
		t.Errorf("control characters from a host reached the text: %q", out.String())
	}
	if !strings.Contains(out.String(), "line one FAKE LINE [31m; rc 2") {
		t.Errorf("the failure message is not kept on one line: %q", out.String())
	}
	if !strings.Contains(out.String(), "PLAY p [2Jlay [all]") || !strings.Contains(out.String(), "h ]0;x ") {
		t.Errorf("the play or host name lost more than its control characters: %q", out.String())
	}
}

func TestSummaryWithoutEvents(t *testing.T) {
	var out bytes.Buffer
	if err := summary.Summarize(nil).WriteText(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no events: ansible-playbook did not run a play") {
		t.Errorf("an empty summary does not say why it is empty: %q", out.String())
	}
}

// TestSummaryAgreesWithAnsible runs the real ansible-playbook on the example playbook with the
// af_events plugin, and checks that the summary's tasks and recap are the ones ansible printed.
func TestSummaryAgreesWithAnsible(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ansible-playbook; skipped with -short")
	}
	bin, err := exec.LookPath("ansible-playbook")
	if err != nil {
		t.Skip("ansible-playbook is not in PATH: run scripts/deps (Debian's ansible-core)")
	}
	t.Parallel()
	work := t.TempDir()
	pluginDir, err := afevents.Install(filepath.Join(work, "plugins"))
	if err != nil {
		t.Fatal(err)
	}
	events, err := os.Create(filepath.Join(work, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	examples, _ := filepath.Abs("../../../examples")
	cmd := exec.CommandContext(ctx, bin, "-i", filepath.Join(examples, "inventory/hosts.yml"), filepath.Join(examples, "playbooks/site.yml"))
	cmd.Dir = work
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + work, "LANG=C.UTF-8", "ANSIBLE_NOCOLOR=1"},
		afevents.Env(pluginDir, 3)...)
	cmd.ExtraFiles = []*os.File{events}
	stdout, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ansible-playbook on the example playbook: %v\n%s", err, stdout)
	}
	s := summary.Summarize(refapptest.ReadEvents(t, events.Name()))

	var tasks []string
	for _, m := range regexp.MustCompile(`(?m)^(TASK|RUNNING HANDLER) \[(.*)\] \*+$`).FindAllStringSubmatch(string(stdout), -1) {
		tasks = append(tasks, m[2])
	}
	var got []string
	for _, p := range s.Plays {
		for _, task := range p.Tasks {
			got = append(got, task.Name)
		}
	}
	if strings.Join(got, "|") != strings.Join(tasks, "|") {
		t.Errorf("summary tasks %q, ansible printed %q", got, tasks)
	}
	recap := regexp.MustCompile(`(?m)^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)`)
	var want []summary.HostRecap
	for _, m := range recap.FindAllStringSubmatch(string(stdout), -1) {
		n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
		want = append(want, summary.HostRecap{Host: m[1], OK: n(2), Changed: n(3), Unreachable: n(4), Failed: n(5), Skipped: n(6), Rescued: n(7), Ignored: n(8)})
	}
	if len(want) == 0 || fmt.Sprint(s.Recap) != fmt.Sprint(want) {
		t.Errorf("summary recap %+v, ansible printed %+v\n%s", s.Recap, want, stdout)
	}
}
